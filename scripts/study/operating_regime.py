"""Where an activation works at initialisation: the per-layer diagnostics of a fresh model.

    python -m scripts.study.operating_regime               # tiny vs the paper's 1.1B
    python -m scripts.study.operating_regime --preset tiny --dim 256 --init-scaling fixed width

Builds each model as the trainer would (seeded, ``model.init_scaling`` applied), runs one
forward of random tokens and prints, per layer group, the MLP pre-activation RMS, its fraction
below zero and the share of the activation's output that is not linear in its input
(``training/instruments/diagnostics.py``). The paper's 1.1B needs about 6 GB of memory and a minute
on CPU.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from model import Llama
from model.presets import load_preset
from scripts.common import markdown
from training.instruments.diagnostics import mlp_diagnostics
from training.runtime.distributed import Env
from training.runtime.parallelize import ParallelConfig, parallelize


def measure(
    preset: str, init_scaling: str, activation: str, dim: int | None, tokens: int, seed: int
):
    overrides = {"activation": activation, "init_scaling": init_scaling}
    if dim is not None:
        overrides |= {"dim": dim, "gated_hidden": 4 * dim}
    config = load_preset(preset, **overrides)
    if config.vocab_size is None:
        config = config.with_vocab_from_tokenizer(258)  # byte tokens, as the CPU experiments
    torch.manual_seed(seed)
    env = Env(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    model = parallelize(Llama(config), env, ParallelConfig(precision="fp32"))
    ids = torch.randint(
        0, config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(seed)
    )
    return config, mlp_diagnostics(model, {"inputs": ids, "targets": ids}, env.device, (1, tokens))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", nargs="+", default=["tiny", "paper_1b"])
    parser.add_argument("--init-scaling", nargs="+", default=["fixed", "width"])
    parser.add_argument("--activation", default="xielu")
    parser.add_argument("--dim", type=int, help="override the preset's width (gated_hidden 4x)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = []
    for preset in args.preset:
        for scaling in args.init_scaling:
            config, layers = measure(
                preset, scaling, args.activation, args.dim, args.tokens, args.seed
            )
            n = len(layers)
            for name, part in (
                ("first", layers[:1]),
                ("middle", layers[n // 2 : n // 2 + 1]),
                ("last", layers[-1:]),
            ):
                rows.append(
                    [
                        preset,
                        str(config.dim),
                        scaling,
                        f"{config.effective_init_std:.4f}",
                        name,
                        *(
                            f"{statistics.fmean(s[k] for s in part):.3f}"
                            for k in ("pre_rms", "neg_frac", "out_rms", "nonlinear")
                        ),
                    ]
                )
    header = [
        "preset",
        "dim",
        "init_scaling",
        "std",
        "layer",
        "pre_rms",
        "neg_frac",
        "out_rms",
        "nonlinear",
    ]
    print(f"{args.activation} at initialisation, {args.tokens} random tokens, seed {args.seed}")
    print("\n".join(markdown(header, rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
