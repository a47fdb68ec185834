"""Evaluation of trained runs: perplexity on held-out data (and, next, downstream tasks)."""
