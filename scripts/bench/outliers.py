"""What the outlier telemetry (``logging.outliers_every``) costs: a measured step, a plain one.

    python -m scripts.bench.outliers                      # tiny model, CPU
    python -m scripts.bench.outliers --preset paper_1b --batch 5 --seq 4096 --bf16 --compile

In one process, the trainer's own step (``training.step.train_step``) timed three ways: plain
(compiled when ``--compile``), plain but eager (what a measured step runs as), and measured (the
telemetry's hooks in place, eager). Printed: the medians, the measured step against the plain
one, and that extra spread over a cadence of ``--every`` steps: the cost of leaving it on.
"""

from __future__ import annotations

import argparse
from itertools import repeat

import torch

from model.presets import available_presets


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny", choices=available_presets())
    parser.add_argument("--activation", default="xielu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--compile", action="store_true", help="compile each block")
    parser.add_argument("--every", type=int, default=50, help="the cadence to amortise over")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)

    from model import Llama
    from model.presets import load_preset
    from scripts.common import median_ms
    from training.instruments.outliers import Recorder
    from training.optim import OptimConfig, build_optimizer
    from training.runtime.distributed import Env
    from training.runtime.parallelize import ParallelConfig, parallelize
    from training.step import train_step

    device = torch.device(args.device)
    torch.manual_seed(0)
    overrides = {"max_seq_len": args.seq}
    if args.preset == "tiny":
        overrides.update(dim=256, n_layers=4, vocab_size=8192)
    config = load_preset(args.preset, activation=args.activation, **overrides)
    model = Llama(config).to(device)
    plan = ParallelConfig(
        precision="bf16" if args.bf16 else "fp32", compile="blocks" if args.compile else "none"
    )
    training = parallelize(model, Env(0, 1, 0, device), plan)
    optimizer = build_optimizer(model, OptimConfig(), device)
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq + 1), device=device)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}

    def step() -> None:
        train_step(training, optimizer, repeat(batch), 1, OptimConfig().grad_clip)

    def eager_step() -> None:
        with torch.compiler.set_stance("force_eager"):
            step()

    def measured_step() -> None:
        recorder = Recorder(model.layers, device)
        try:
            eager_step()
        finally:
            recorder.remove()
        recorder.scalars(device)

    times = {
        name: median_ms(fn, device, args.warmup, args.repeats)
        for name, fn in (("plain", step), ("eager", eager_step), ("measured", measured_step))
    }
    extra = times["measured"] - times["plain"]
    print(
        f"{args.preset} ({config.dim} x {config.n_layers}), {args.activation}, batch "
        f"{args.batch} x {args.seq} on {device}, {'bf16' if args.bf16 else 'fp32'}, "
        f"{'compiled blocks' if args.compile else 'eager'}; median of {args.repeats} steps"
    )
    for name, ms in times.items():
        print(f"  {name:9s} {ms:9.1f} ms  x{ms / times['plain']:.3f}")
    print(
        f"  a measured step costs {extra:+.1f} ms; every {args.every} steps that is "
        f"{100 * extra / (args.every * times['plain']):+.2f}% of the training time"
    )
    return times


if __name__ == "__main__":
    main()
