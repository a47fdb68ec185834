#!/usr/bin/env bash
# paper_1b as shipped (bf16, compiled blocks, selective checkpointing; one process) at
# toy size on one GPU: stopped by SIGTERM after step 5 (the tests' fault plugin, tests/faults.py),
# resumed by the same command, then checked: every step 1..12 logged once, a finite loss.
#   bash scripts/gpu_resume.sh DATA_DIR RUN_DIR [OVERRIDE ...]   (part of gpu_checks.sh first)
# The byte tokenizer: the GPU machine lacks mistral-common's dependencies, and this checks
# training on the GPU, not tokenization.
set -uo pipefail
data=$1 dir=$2
shift 2
rm -rf "$dir"
args=(experiment=paper_1b model.dim=256 model.n_layers=4 model.n_heads=4 model.gated_hidden=1024
  model.max_seq_len=256 data.seq_len=256 "data.paths=[$data/*.json.gz]"
  data.validation_documents=8 trainer.global_batch=8 trainer.micro_batch=4 trainer.steps=12
  schedule.warmup_steps=3 schedule.decay_steps=4 trainer.log_every=1 validation.every=6
  validation.batches=1 checkpoint.every=6 "trainer.run_dir=$dir"
  logging.wandb.mode=disabled data.tokenizer.name=bytes "$@")
launch=(python train.py)  # torchrun would turn the exit code 75 into 1
rc=0
XIELU_PLUGINS=tests/faults.py XIELU_FAULTS='{"signal": "SIGTERM@5"}' "${launch[@]}" "${args[@]}" ||
  rc=$?
if (( rc != 75 )); then echo "resume: the stopped run exited $rc, not 75 (preempted)"; exit 1; fi
"${launch[@]}" "${args[@]}" || { echo "resume: the resumed run failed"; exit 1; }
python - "$dir/metrics.jsonl" <<'PY'
import json, math, sys

records = [json.loads(line) for line in open(sys.argv[1])]
losses = {r["step"]: r["loss"] for r in records if "loss" in r}
steps = [r["step"] for r in records if "loss" in r]
assert steps == list(range(1, 13)), f"steps logged: {steps}"
assert all(math.isfinite(v) for v in losses.values()), losses
print("resume: steps 1..12 once each; loss", " ".join(f"{losses[s]:.3f}" for s in steps))
PY
