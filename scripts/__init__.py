"""Command-line tools around the library: benchmarks, HF export, tokenization, sweeps, figures,
tables. Run one from the repository root as ``python -m scripts.NAME``.

Scripts never import one another: what two of them share lives in ``scripts.common`` (timing,
saved-tensor bytes, tables, run metrics) or, for figures, ``scripts.figures``.
"""
