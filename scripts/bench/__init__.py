"""Benchmarks: speed and memory measured as ratios against a baseline in the same run (compiled
ReLU², plain SDPA, the raw tokenizer, a synchronous save), never asserted in a test. Each is a
module: ``python -m scripts.bench.throughput --help``. What they measured: docs/performance.md."""
