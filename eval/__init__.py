"""Evaluation of trained runs, and the paper's numbers they are compared with.

- ``perplexity``: a checkpoint's loss on held-out data (``python -m eval.perplexity``).
- ``harness``: the lm-evaluation-harness adapter for the project's own model, any activation.
- ``local_tasks``: the paper's downstream suite as lm-eval tasks over local files (no Hub).
- ``downstream``: a run's downstream accuracy through the harness, printed like the paper's
  table (``python -m eval.downstream``).
- ``paper``: the paper's reported numbers as data, for our tables and tests to compare with.
"""
