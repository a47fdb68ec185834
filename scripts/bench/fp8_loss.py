"""bf16 against FP8 training loss, per activation, over a short run at a small size (a GPU).

    python -m scripts.bench.fp8_loss --data /path/to/c4 --activations relu2 xielu \
        --float8 none tensorwise rowwise --seeds 0 1

Each (activation, recipe, seed) is one ``train.py`` run of paper_1b's recipe (bf16, WSD)
shrunk to 4 layers of width 512 at 512 byte tokens per sequence, 40 steps of 16 sequences,
uncompiled, with every linear layer but the LM head in FP8 (torchao's size filter off: at this
width it would keep them all in bf16). Printed: the mean training loss of the last
10 steps and the final validation loss, and their difference to bf16 at the same activation
and seed. What an FP8 recipe costs in loss shows up here first; the runs are far too short to
say anything about divergence late in training (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from statistics import mean

from scripts.common import markdown

SIZE = {
    "experiment": "paper_1b",
    "model.dim": 512,
    "model.n_layers": 4,
    "model.n_heads": 8,
    "model.gated_hidden": 2048,
    "model.max_seq_len": 512,
    "data.seq_len": 512,
    "data.validation_documents": 16,
    "trainer.global_batch": 16,
    "trainer.micro_batch": 8,
    "trainer.steps": 40,
    "schedule.warmup_steps": 10,
    "schedule.decay_steps": 10,
    "parallel.compile": "none",
    "parallel.activation_checkpointing": "none",
    "parallel.float8_auto_filter": "false",
    "trainer.log_every": 1,
    "validation.every": 40,
    "validation.batches": 4,
    "checkpoint.every": 0,
    "logging.wandb.mode": "disabled",
    # UTF-8 bytes: the GPU machine lacks mistral-common's dependencies, and the LM head (the
    # vocabulary's only user) stays bf16 under every recipe
    "data.tokenizer.name": "bytes",
}
LAST = 10  # training loss: the mean over the last steps (one step's loss is noisy)


def run(activation: str, recipe: str, seed: int, data: Path, out: Path) -> dict:
    run_dir = out / f"{activation}-{recipe}-{seed}"
    overrides = {
        **SIZE,
        "activation": activation,
        "parallel.float8": recipe,
        "trainer.seed": seed,
        "data.paths": f"[{data}/*.json.gz]",
        "trainer.run_dir": str(run_dir),
    }
    command = [sys.executable, "train.py", *(f"{k}={v}" for k, v in overrides.items())]
    subprocess.run(command, check=True)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    val = [r["val/loss"] for r in records if "val/loss" in r]
    return {
        "activation": activation,
        "float8": recipe,
        "seed": seed,
        "train": mean(losses[-LAST:]),
        "val": val[-1] if val else float("nan"),
    }


def table(rows: list[dict]) -> list[str]:
    base = {(r["activation"], r["seed"]): r for r in rows if r["float8"] == "none"}
    body = []
    for r in rows:
        b = base.get((r["activation"], r["seed"]))
        body.append(
            [
                r["activation"],
                r["float8"],
                str(r["seed"]),
                f"{r['train']:.4f}",
                f"{r['val']:.4f}",
                f"{r['train'] - b['train']:+.4f}" if b else "-",
                f"{r['val'] - b['val']:+.4f}" if b else "-",
            ]
        )
    header = ["activation", "float8", "seed", "train (last 10)", "val", "d train", "d val"]
    return markdown(header, body)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="a folder of .json.gz files")
    parser.add_argument("--activations", nargs="+", default=["relu2", "xielu"])
    parser.add_argument("--float8", nargs="+", default=["none", "tensorwise"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/fp8_loss"))
    args = parser.parse_args(argv)
    rows = []
    for activation in args.activations:
        for seed in args.seeds:
            for recipe in args.float8:
                rows.append(run(activation, recipe, seed, args.data.resolve(), args.out))
                print(json.dumps(rows[-1]), flush=True)
    print("\n".join(table(rows)))
    return rows


if __name__ == "__main__":
    main()
