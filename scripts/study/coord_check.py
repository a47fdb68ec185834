"""µP's coordinate check: does any activation in the model grow or vanish with width in training?

    python -m scripts.study.coord_check                          # widths 64-1024, three MLPs, table
    python -m scripts.study.coord_check --out docs/coord_check   # also the figure and a CSV

A parametrization is a set of width rules (``model.parametrization``, docs/model.md). Whether
the rules are right is not a matter of reading code: train the same model at several widths for
a few steps and look at the size of every layer's output. For each width, parametrization and
MLP this builds the model as the trainer does (seeded; the trainer's parameter groups, so µP's
per-group rates and weight decay are the ones a run gets), takes ``--steps`` AdamW steps at a
constant rate on real text (the builtin corpus, byte tokens, the same batches at every width;
no clipping, which would hide exactly the growth looked for), and after each step measures on
one fixed batch the RMS of

- the embedding's output, each block's attention and MLP outputs and the block's output (the
  residual stream), the MLP pre-activation (the gate's, for a gated MLP), and the logits;
- how much each moved: the RMS of its change since initialisation, on the same batch.

The prediction (Tensor Programs V) is in slopes of log RMS against log width. Under µP every
change is width-independent (slope 0): a hidden matrix's Adam update is ``lr / m`` per entry,
and its effect on the next layer sums ``dim`` correlated terms, so ``dim x lr / m`` stays put.
Under the standard parametrization the same sum is ``dim x lr``: the changes grow about as
width (slope up to 1, more where growing inputs compound). At initialisation a hidden
matrix's output is std x sqrt(fan_in) times its input's RMS: flat under µP, whose std falls as
1/sqrt(width), growing as width^1/2 per matrix under the standard parametrization at a fixed
std; µP's logits start at width^-1/2 (the readout's 1/m on a sum of ``dim`` random terms) and
move by Θ(1) once trained. ``tests/test_coord_check.py`` asserts these slopes.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from data import DataConfig, TokenizerConfig, build_loader, load_tokenizer
from eval.comparison import power_law_fit
from model import Llama
from model.presets import load_preset
from scripts.common import markdown, write_csv
from scripts.figures import pyplot, save
from training.optim import OptimConfig, build_optimizer
from training.parameter_groups import set_learning_rate

PARAMETRIZATIONS = ("standard", "mup")
# the width study's base (configs/experiment/width.yaml): std 0.0975 = 0.78 / sqrt(64)
BASE_DIM, BASE_STD, HEAD_DIM = 64, 0.0975, 32


@dataclass(frozen=True)
class Setup:
    """What a coordinate check holds fixed while the width varies."""

    activation: str = "xielu"
    n_layers: int = 4
    base_dim: int = BASE_DIM
    init_std: float = BASE_STD
    lr: float = 1e-2
    steps: int = 4
    batch: int = 8
    seq_len: int = 128
    seed: int = 0


def shape(dim: int) -> dict[str, int]:
    """The width study's model at ``dim``: heads of a fixed ``HEAD_DIM`` (so the attention's
    1/sqrt(head_dim) is already µP's), the gated MLP 4 x dim (the plain one 1.5 x that)."""
    return {"dim": dim, "n_heads": dim // HEAD_DIM, "gated_hidden": 4 * dim}


def model_for(setup: Setup, parametrization: str, dim: int, vocab_size: int) -> Llama:
    """The tiny preset at ``dim``, shaped as the width study shapes it (:func:`shape`)."""
    config = load_preset(
        "tiny",
        **shape(dim),
        n_layers=setup.n_layers,
        activation=setup.activation,
        init_std=setup.init_std,
        parametrization=parametrization,
        mup_base_dim=setup.base_dim,
        max_seq_len=setup.seq_len,
    ).with_vocab_from_tokenizer(vocab_size)
    torch.manual_seed(setup.seed)
    return Llama(config)


def batches(setup: Setup) -> Iterator[dict[str, torch.Tensor]]:
    """Byte-token windows of the builtin corpus, in the same order for every model."""
    config = DataConfig(
        tokenizer=TokenizerConfig(name="bytes"),
        seq_len=setup.seq_len,
        seed=setup.seed,
        num_workers=0,
    )
    return iter(build_loader(config, setup.batch))


class Recorder:
    """Forward hooks that keep each named module's output (the first input, for the
    activation: its pre-activation) from the latest forward."""

    def __init__(self, model: Llama) -> None:
        self.outputs: dict[str, torch.Tensor] = {}
        self.handles = []
        self._hook(model.embed_tokens, "embedding")
        for i, block in enumerate(model.layers):
            self._hook(block.self_attn, f"layer{i}.attention")
            self._hook(block.mlp.act_fn, f"layer{i}.pre_activation", take_input=True)
            self._hook(block.mlp, f"layer{i}.mlp")
            self._hook(block, f"layer{i}.block")
        self._hook(model.lm_head, "logits")

    def _hook(self, module: torch.nn.Module, name: str, take_input: bool = False) -> None:
        def hook(module, inputs, output):
            self.outputs[name] = (inputs[0] if take_input else output).detach().double()

        self.handles.append(module.register_forward_hook(hook))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _rms(x: torch.Tensor) -> float:
    return x.pow(2).mean().sqrt().item()


def coordinates(setup: Setup, parametrization: str, dim: int) -> list[dict]:
    """One row per (quantity, step 0..steps): its RMS and the RMS of its change since step 0,
    on a fixed batch, for one model trained ``setup.steps`` AdamW steps."""
    tokenizer = load_tokenizer(TokenizerConfig(name="bytes"))
    model = model_for(setup, parametrization, dim, tokenizer.vocab_size)
    optimizer = build_optimizer(model, OptimConfig(lr=setup.lr), torch.device("cpu"))
    set_learning_rate(optimizer, setup.lr)  # each group's multiplier: µP's lr / m
    stream = batches(setup)
    probe = next(stream)["inputs"]
    rows, initial = [], {}
    for step in range(setup.steps + 1):
        if step:
            batch = next(stream)
            model.train()
            optimizer.zero_grad(set_to_none=True)
            model(batch["inputs"], batch["targets"]).backward()
            optimizer.step()
        model.eval()
        recorder = Recorder(model)  # on the probe only: the training forwards need no copies
        try:
            with torch.no_grad():
                model(probe)
        finally:
            recorder.remove()
        for name, value in recorder.outputs.items():
            initial.setdefault(name, value)
            rows.append(
                {
                    "parametrization": parametrization,
                    "activation": setup.activation,
                    "width": dim,
                    "step": step,
                    "quantity": name,
                    "rms": _rms(value),
                    "change": _rms(value - initial[name]),
                }
            )
    return rows


def check(setup: Setup, widths: list[int]) -> list[dict]:
    """Every width under both parametrizations."""
    return [
        row
        for parametrization in PARAMETRIZATIONS
        for dim in widths
        for row in coordinates(setup, parametrization, dim)
    ]


def kind(quantity: str) -> str:
    """``layer2.mlp`` -> ``mlp``: the quantity without its layer."""
    return quantity.split(".", 1)[-1]


def slope(widths: list[float], values: list[float]) -> float:
    """Least-squares slope of log(value) against log(width): the exponent of a power law."""
    return -power_law_fit(widths, [max(v, 1e-30) for v in values])[1]


def slopes(rows: list[dict], step: int, measure: str) -> dict[tuple[str, str, str], float]:
    """(parametrization, activation, quantity) -> slope of ``measure`` (``rms`` or
    ``change``) against width at ``step``."""
    series = defaultdict(list)
    for row in rows:
        if row["step"] == step:
            key = (row["parametrization"], row["activation"], row["quantity"])
            series[key].append((row["width"], row[measure]))
    return {
        key: slope([w for w, _ in points], [v for _, v in points])
        for key, points in ((key, sorted(points)) for key, points in series.items())
        if len(points) > 1
    }


def summary(rows: list[dict], step: int) -> list[list[str]]:
    """Per parametrization, activation and kind of quantity, the range of slopes over layers
    of the RMS at initialisation and of its change at ``step``."""
    at_init, moved = slopes(rows, 0, "rms"), slopes(rows, step, "change")
    groups = defaultdict(lambda: ([], []))
    for (parametrization, activation, quantity), value in moved.items():
        group = groups[(parametrization, activation, kind(quantity))]
        group[0].append(at_init[(parametrization, activation, quantity)])
        group[1].append(value)
    return [
        [p, a, k, f"{min(i):+.2f} to {max(i):+.2f}", f"{min(c):+.2f} to {max(c):+.2f}"]
        for (p, a, k), (i, c) in sorted(groups.items())
    ]


def plot(rows: list[dict], step: int, out: Path) -> Path:
    """Columns: activation x parametrization; rows: RMS at init, its change at ``step``;
    one line per quantity kind (mean over layers), against width on log-log axes."""
    plt = pyplot()
    activations = sorted({r["activation"] for r in rows})
    columns = [(a, p) for a in activations for p in PARAMETRIZATIONS]
    fig, axes = plt.subplots(
        2, len(columns), figsize=(3.2 * len(columns), 6), sharex=True, squeeze=False
    )
    for c, (activation, parametrization) in enumerate(columns):
        for r, (measure, at) in enumerate((("rms", 0), ("change", step))):
            ax = axes[r][c]
            lines = defaultdict(lambda: defaultdict(list))
            for row in rows:
                if (row["activation"], row["parametrization"], row["step"]) == (
                    activation,
                    parametrization,
                    at,
                ):
                    lines[kind(row["quantity"])][row["width"]].append(row[measure])
            for name, by_width in sorted(lines.items()):
                widths = sorted(by_width)
                means = [sum(by_width[w]) / len(by_width[w]) for w in widths]
                ax.plot(widths, means, marker="o", label=name)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{activation}, {parametrization}", fontsize=9)
            if c == 0:
                ax.set_ylabel("RMS at init" if r == 0 else f"RMS of change, step {step}")
            if r == 1:
                ax.set_xlabel("width (dim)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return save(fig, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--activations", nargs="+", default=["relu2", "swiglu", "xielu"])
    parser.add_argument("--layers", type=int, default=Setup.n_layers)
    parser.add_argument("--steps", type=int, default=Setup.steps)
    parser.add_argument("--lr", type=float, default=Setup.lr)
    parser.add_argument("--base-dim", type=int, default=BASE_DIM)
    parser.add_argument("--init-std", type=float, default=BASE_STD)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="directory for coord_check.png and .csv")
    args = parser.parse_args(argv)
    for width in args.widths:
        if width % HEAD_DIM:
            parser.error(f"--widths: {width} is not a multiple of the head dimension {HEAD_DIM}")
    rows = []
    for activation in args.activations:
        setup = Setup(
            activation=activation,
            n_layers=args.layers,
            base_dim=args.base_dim,
            init_std=args.init_std,
            lr=args.lr,
            steps=args.steps,
            seed=args.seed,
        )
        rows += check(setup, args.widths)
    print(
        f"slopes of log RMS against log width (widths {args.widths}, base {args.base_dim}, "
        f"lr {args.lr}, {args.steps} AdamW steps), min to max over layers"
    )
    header = ["parametrization", "activation", "quantity", "at init", f"change at {args.steps}"]
    print("\n".join(markdown(header, summary(rows, args.steps))))
    if args.out:
        write_csv(rows, args.out / "coord_check.csv")
        print(f"figure: {plot(rows, args.steps, args.out / 'coord_check.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
