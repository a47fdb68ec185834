"""Command-line tools around the library, in three kinds. Run one from the repository root as
``python -m scripts.NAME``.

- ``scripts.*``: the tools a user runs: sweeps and what prices them (``sweep``,
  ``estimate_sweep``, ``estimate_memory``), data (``pretokenize``, ``train_sentencepiece``,
  ``build_prose_corpus``), results (``results_table``, ``plot_*``), export (``export_hf``), the
  GPU checks (``gpu_checks.sh``) and mutation testing of a module (``mutation``).
- ``scripts.bench.*``: benchmarks, each measured against a baseline in the same run.
- ``scripts.study.*``: the CPU studies' reports and the measurements they need.

Scripts never import one another: what two of them share lives in ``scripts.common`` (timing,
saved-tensor bytes, tables, run metrics) or, for figures, ``scripts.figures``.
"""
