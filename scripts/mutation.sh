#!/usr/bin/env bash
# Mutation testing of the core modules with mutmut (configured in pyproject.toml, [tool.mutmut]):
# activation formulas, schedule, packing, loss, sampling, repartition, validation, the trainer.
#
#   bash scripts/mutation.sh              # every mutant, then the score table per module
#   bash scripts/mutation.sh 'training.schedule*'   # the mutants whose names match
#
# mutmut keeps its results in mutants/ (ignored by git) and reruns only what changed; delete
# mutants/ for a clean run. About 3100 mutants: hours on 2 cores, most in the trainer's modules;
# run them by pattern.
set -euo pipefail
cd "$(dirname "$0")/.."
nice -n 10 mutmut run --max-children "${MUTATION_JOBS:-2}" "$@"
python -m scripts.mutation_scores --survivors
