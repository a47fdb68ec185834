"""The README and docs/ stay true. README's Python examples run as written and do what their
comments say, checked against independent truth (the paper's formulas, autograd, counts by hand)
in the namespace the example leaves behind; the Python examples of docs/*.md run as written; and
every command the pages name can run: its module or script exists, its argument parser accepts
the arguments, and train.py's Hydra overrides compose into a valid configuration; and every count
the pages state (parameters, runs, registered names, defaults) is the one the code gives."""

import argparse
import contextlib
import functools
import importlib
import importlib.util
import io
import math
import re
import shlex
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from train_helpers import SWEEP_DATA, SWEEP_POINTS, compose

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)


def python_blocks(page: Path) -> list[str]:
    return [body for lang, body in FENCE.findall(page.read_text()) if lang == "python"]


BLOCKS = python_blocks(README)
DOC_BLOCKS = [(page, i, block) for page in DOCS for i, block in enumerate(python_blocks(page))]


def library_tour(ns: dict) -> None:
    """The first example's comments: the default scalars, gated SwiGLU, the folded module."""
    act = ns["act"]
    assert ns["y"].shape == (4, 1024)
    assert act.effective_scalars() == pytest.approx({"alpha_p": 0.8, "alpha_n": 0.8})
    assert ns["is_gated"]("swiglu") is True and ns["is_gated"]("xielu") is False
    gate, up = torch.randn(3, 8), torch.randn(3, 8)
    torch.testing.assert_close(ns["swiglu"](gate, up), torch.nn.functional.silu(gate) * up)
    x = torch.linspace(-5, 3, 101)
    torch.testing.assert_close(ns["infer"](x), act(x).detach())
    # paper eq. 8 at alpha_p = alpha_n = 0.8, beta = 0.5, eps = -1e-6
    negative = 0.8 * torch.expm1(x.clamp(max=-1e-6)) - 0.8 * x + 0.5 * x
    torch.testing.assert_close(act(x).detach(), torch.where(x > 0, 0.8 * x * x + 0.5 * x, negative))


def designed_tanh(ns: dict) -> None:
    """The design example's comment: slope 2 alpha_p x + 0.5 above zero, alpha_n tanh(x) + 0.5
    below (both alphas 0.8 through softplus at init), checked by autograd; and what it prints,
    as its last comment says."""
    assert ns["printed"].strip() == ns["block"].strip().splitlines()[-1].removeprefix("# ")
    x = torch.linspace(-3, 3, 60, dtype=torch.float64).requires_grad_()
    (slope,) = torch.autograd.grad(ns["act"].double()(x).sum(), x)
    x = x.detach()
    expected = torch.where(x > 0, 2 * 0.8 * x + 0.5, 0.8 * torch.tanh(x) + 0.5)
    torch.testing.assert_close(slope, expected)


def matched_sizes(ns: dict) -> None:
    """docs/model.md: what the example prints, and what its comments say it prints, are the
    paper_1b shape's parameters counted by hand: tied embedding, attention, two norms per block
    and a final one, a gated MLP of 3 x 6144 or a plain one of 2 x 9216 (the same count), and
    xIELU's alpha_p and alpha_n per layer."""
    vocab, dim, layers = 147456, 1536, 24  # configs/model/paper_1b.yaml
    shared = vocab * dim + layers * (4 * dim * dim + 2 * dim) + dim
    expected = [
        f"swiglu 6144 {shared + layers * 3 * dim * 6144}",
        f"xielu 9216 {shared + layers * 2 * dim * 9216 + 2 * layers}",
        f"relu2 9216 {shared + layers * 2 * dim * 9216}",
    ]
    assert ns["printed"].splitlines() == expected
    claimed = re.findall(r"^# (\w+ \d+ \d+)", ns["block"], flags=re.M)
    assert claimed == expected


CLAIMS = {
    "act.effective_scalars()": library_tour,
    "tanh_base = BaseGradient": designed_tanh,
    "count_parameters(config).total": matched_sizes,
}


def run_block(block: str, name: str) -> dict:
    """The namespace a block leaves, with what it printed and its own text."""
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, name, "exec"), namespace)
    return {**namespace, "printed": printed.getvalue(), "block": block}


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_example_runs_and_keeps_its_comments_promises(index):
    block = BLOCKS[index]
    namespace = run_block(block, f"README.md[python block {index}]")
    checks = [check for marker, check in CLAIMS.items() if marker in block]
    assert checks, f"README python block {index} has no check of what its comments say"
    for check in checks:
        check(namespace)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize(
    ("page", "index", "block"),
    DOC_BLOCKS,
    ids=[f"{page.name}[{i}]" for page, i, _ in DOC_BLOCKS],
)
def test_docs_python_example_runs_as_written(page, index, block):
    """A block that is not meant to run is fenced as ```text, not skipped here."""
    namespace = run_block(block, f"docs/{page.name}[python block {index}]")
    for marker, check in CLAIMS.items():
        if marker in block:
            check(namespace)


# --- commands ---------------------------------------------------------------------------------


class CommandError(Exception):
    """Why a command named in the docs would not run."""


class Parsed(Exception):  # noqa: N818 (not an error: main's way out once parsing succeeded)
    """Raised instead of running a script once its parser has accepted the arguments."""

    def __init__(self, namespace: argparse.Namespace):
        super().__init__()
        self.namespace = namespace


def stop_after(parse):
    def parse_and_stop(self, args=None, namespace=None):
        raise Parsed(parse(self, args, namespace))

    return parse_and_stop


def parsed_arguments(module, argv: list[str]) -> argparse.Namespace | None:
    """The arguments ``module.main(argv)`` would run with. Every script builds its parser inside
    ``main(argv)`` and parses before doing anything else, so main is called with argparse's two
    entry points patched to stop right after parsing; a rejected argument is argparse's own
    message. None for ``--help``."""
    parser = argparse.ArgumentParser
    err = io.StringIO()
    try:
        with (
            mock.patch.object(parser, "parse_args", stop_after(parser.parse_args)),
            mock.patch.object(
                parser, "parse_intermixed_args", stop_after(parser.parse_intermixed_args)
            ),
            mock.patch.object(sys, "argv", [f"python -m {module.__name__}"]),  # argparse's prog
            contextlib.redirect_stderr(err),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            module.main(argv)
    except Parsed as parsed:
        return parsed.namespace
    except SystemExit as stop:
        if stop.code == 0:
            return None
        raise CommandError(err.getvalue().strip().splitlines()[-1]) from None
    raise CommandError(f"{module.__name__}.main returned without parsing its arguments")


def compose_overrides(overrides: list[str]) -> None:
    """The configuration train.py would build from these overrides, or the error it stops with.
    A published checkpoint a page names (Apertus 8B) is not on this machine: the tests' tiny
    Apertus stands in for it, as a page's data paths stand in for files nobody reads here."""
    from hf_fixtures import apertus_checkpoint

    stand_in = f"checkpoint.initial_hf={apertus_checkpoint()}"
    overrides = [stand_in if o.startswith("checkpoint.initial_hf=") else o for o in overrides]
    try:
        compose(overrides)
    except Exception as error:  # Hydra's and the schema's errors all name the key
        raise CommandError(f"the overrides do not compose: {error}") from None


def names_of_tests(paths: list[Path]) -> list[str]:
    files = paths or sorted((ROOT / "tests").glob("test_*.py"))
    return [n for f in files for n in re.findall(r"^def (test_\w+)", f.read_text(), flags=re.M)]


PYTEST_VALUE_OPTIONS = {"-k", "-m", "-n", "-p", "--dist", "--durations"}


def check_pytest(args: list[str], markers: list[str]) -> None:
    """Test files and ``::test`` names exist; every word of ``-k`` matches one of their tests;
    every marker of ``-m`` is registered (pyproject.toml)."""
    options, paths = {}, []
    args = iter(args)
    for arg in args:
        if arg in PYTEST_VALUE_OPTIONS:
            options[arg] = next(args)
        elif not arg.startswith("-"):
            paths.append(arg)
    files = []
    for path in paths:
        file, _, name = path.partition("::")
        if not (ROOT / file).exists():
            raise CommandError(f"{file} does not exist")
        if name and name not in names_of_tests([ROOT / file]):
            raise CommandError(f"{file} has no test {name}")
        files.append(ROOT / file)
    names = names_of_tests([f for f in files if f.is_file()])
    for word in re.findall(r"\w+", options.get("-k", "")):
        if word not in ("and", "or", "not") and not any(word in n for n in names):
            raise CommandError(f"-k {word!r} selects no test in {paths or 'tests/'}")
    for word in re.findall(r"\w+", options.get("-m", "")):
        if word not in ("and", "or", "not") and word not in markers:
            raise CommandError(f"-m {word!r} is not a registered marker ({', '.join(markers)})")


def check_module(name: str, args: list[str], markers: list[str]) -> None:
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        raise CommandError(f"there is no module {name}")
    if name == "pytest":
        return check_pytest(args, markers)
    package = ROOT / name.split(".")[0]
    if spec.origin is None or package not in [*Path(spec.origin).parents, Path(spec.origin)]:
        return  # not this project's (the standard library, pip): existence is what can be checked
    module = importlib.import_module(name)
    if not hasattr(module, "main") or "argparse" not in Path(spec.origin).read_text():
        return
    namespace = parsed_arguments(module, args)
    if name == "scripts.sweep" and namespace is not None:
        # A sweep's jobs are train.py runs with its overrides and the command's. One job per grid
        # puts the command's overrides on each experiment; that every swept activation composes
        # with every experiment is test_train.py's test_every_activation_and_experiment_composes.
        try:
            grids = module.load_sweep(namespace.sweep)["grids"]
        except SystemExit as error:
            raise CommandError(str(error)) from None
        for grid in grids:
            compose_overrides(module.expand({"grids": [grid]}, namespace.overrides)[0])


def check_script(path: str, args: list[str], markers: list[str]) -> None:
    if not (ROOT / path).is_file():
        raise CommandError(f"there is no file {path}")
    if path == "train.py":
        if args[:2] in (["--cfg", "job"], ["-c", "job"]):  # Hydra prints the config it composes
            args = args[2:]
        return compose_overrides(args)
    if path.endswith(".py") and (ROOT / path).parent != ROOT:
        check_module(path.removesuffix(".py").replace("/", "."), args, markers)


def after(tokens: list[str], index: int) -> tuple[str | None, list[str]]:
    """What a launcher (torchrun) starts: ``-m MODULE`` or ``SCRIPT.py``, and its arguments.
    Launcher options come first and take their values with ``=``."""
    for i in range(index, len(tokens)):
        if tokens[i] == "-m":
            return "-m " + tokens[i + 1], tokens[i + 2 :]
        if not tokens[i].startswith("-"):
            return tokens[i], tokens[i + 1 :]
    return None, []


def check_command(tokens: list[str], markers: list[str]) -> None:
    """One shell command: ``python -m MODULE``, ``python SCRIPT.py``, torchrun (also after srun),
    sbatch of the training script, bash of a script in this repository."""
    while tokens and (re.fullmatch(r"\w+=\S*", tokens[0]) or tokens[0] == "env"):
        tokens = tokens[3:] if tokens[:2] == ["env", "-u"] else tokens[1:]
    if not tokens:
        return
    if tokens[0] in ("python", "python3"):
        target, args = after(tokens, 1)
    elif "torchrun" in tokens:
        target, args = after(tokens, tokens.index("torchrun") + 1)
    elif tokens[0] == "sbatch":
        target, args = after(tokens, 1)
        if not (ROOT / target).is_file():
            raise CommandError(f"there is no file {target}")
        return compose_overrides(args)  # slurm/train.sbatch hands them to train.py
    elif tokens[0] == "bash" and len(tokens) > 1:
        if not (ROOT / tokens[1]).is_file():
            raise CommandError(f"there is no file {tokens[1]}")
        return
    else:
        return
    if target is None:
        return
    if any(PLACEHOLDER.search(arg) for arg in args):
        return check_exists(target)  # a template (`data=<name>`): the reader fills in the rest
    if target.startswith("-m "):
        return check_module(target[3:], args, markers)
    return check_script(target, args, markers)


PLACEHOLDER = re.compile(r"<\w+>")


def check_exists(target: str) -> None:
    if not target.startswith("-m "):
        if not (ROOT / target).is_file():
            raise CommandError(f"there is no file {target}")
        return
    try:
        spec = importlib.util.find_spec(target[3:])
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        raise CommandError(f"there is no module {target[3:]}")


def split_shell(line: str) -> list[list[str]]:
    """A shell line's simple commands (split at ;, &&, ||, |), comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if set(token) <= set(";&|"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    return [c for c in [*commands, current] if c]


COMMAND = re.compile(r"(?:env (?:-u \w+ )*|\w+=\S* )*(?:python3? |torchrun |sbatch )")


def named_commands() -> list[tuple[str, str]]:
    """(where, command) for every line of a ```bash block and every inline code span that starts
    with a command, in README.md and docs/*.md."""
    found = []
    for page in PAGES:
        text = page.read_text()
        where = page.relative_to(ROOT).as_posix()
        for match in FENCE.finditer(text):
            if match.group(1) != "bash":
                continue
            first = text.count("\n", 0, match.start(2)) + 1
            # a continued line joins its command; the command is named at its first line
            body = re.sub(r"\s*\\\n\s*", " ", match.group(2))
            lines = match.group(2).split("\n")
            starts = [first + i for i in range(len(lines)) if i == 0 or lines[i - 1][-1:] != "\\"]
            for line, start in zip(body.split("\n"), starts, strict=False):
                if line.strip() and not line.lstrip().startswith("#"):
                    found.append((f"{where}:{start}", line.strip()))
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for match in re.finditer(r"`([^`\n]+)`", prose):
            if COMMAND.match(match.group(1)):
                found.append((f"{where}:{prose.count(chr(10), 0, match.start()) + 1}", match[1]))
    return found


COMMANDS = named_commands()


def expand_optional(command: str) -> str:
    """``[--flag value]`` in a doc means an optional part: it must parse too."""
    return re.sub(r"\[(--[^\]]*)\]", r"\1", command)


# a sweep's command composes every point of the sweep: a second or more for the larger ones
@pytest.mark.parametrize(
    ("where", "command"),
    [
        pytest.param(
            where, command, id=where, marks=[pytest.mark.slow] * ("scripts.sweep" in command)
        )
        for where, command in COMMANDS
    ],
)
def test_every_command_in_the_docs_parses(where, command, pytestconfig):
    markers = [line.split(":")[0] for line in pytestconfig.getini("markers")]
    for tokens in split_shell(expand_optional(command)):
        try:
            check_command(tokens, markers)
        except CommandError as error:
            pytest.fail(f"{where}: `{command}`: {error}", pytrace=False)


def test_commands_of_every_kind_are_found_in_the_docs():
    kinds = {
        "python -m": any(c.startswith("python -m scripts.") for _, c in COMMANDS),
        "train.py": any(c.startswith("python train.py ") for _, c in COMMANDS),
        "torchrun": any("torchrun" in c for _, c in COMMANDS),
        "sbatch": any(c.startswith("sbatch ") for _, c in COMMANDS),
    }
    assert all(kinds.values()), kinds


# --- numbers ----------------------------------------------------------------------------------
# A count that changes as the project grows (parameters, runs, registered names, defaults) is
# written in the pages only where this section computes it from the code, so a change to the code
# that makes a page wrong fails here, saying what the page should now read. Timings and losses are
# measurements: the pages give their command, machine and date instead, and nothing checks them.


@functools.cache
def experiment(*overrides: str) -> tuple:
    """The composed ExperimentConfig and its model config with the tokenizer's vocabulary, as
    train.py builds them (local sources get a path that is never read)."""
    from data import load_tokenizer

    config, _ = compose([*overrides, "data.paths=[/not/read]"])
    vocab = load_tokenizer(config.data.tokenizer).vocab_size
    return config, config.model.with_vocab_from_tokenizer(vocab)


def tokens_per_run(config) -> int:
    return config.trainer.steps * config.trainer.global_batch * config.data.seq_len


def jobs(sweep: str) -> list[list[str]]:
    from training.sweeps import expand, load_sweep

    return expand(load_sweep(sweep), SWEEP_DATA)  # the sweep_points group's paths: one cache


def seeds(sweep: str) -> int:
    return len({o for job in jobs(sweep) for o in job if o.startswith("trainer.seed=")}) or 1


def seeds_per_arm(sweep: str) -> str:
    """How many seeds each grid of a sweep runs: "3", or a range such as "3-5"."""
    arms: dict[tuple, int] = {}
    for job in jobs(sweep):
        arm = tuple(o for o in job if not o.startswith(("trainer.seed=", "trainer.run_dir=")))
        arms[arm] = arms.get(arm, 0) + 1
    counts = set(arms.values())
    return f"{min(counts)}-{max(counts)}" if len(counts) > 1 else str(counts.pop())


def millions(n: float) -> str:
    return f"{n / 1e6:.1f}M"


def readme_numbers() -> list[str]:
    from model import count_parameters

    quick, model = experiment()
    t, seq, v = quick.trainer, quick.data.seq_len, quick.validation
    tekken = count_parameters(experiment("data.tokenizer.name=mistral_nemo")[1])
    assert tekken.embedding > tekken.total / 2, (
        "README: the Tekken model's parameters are no longer mostly embedding"
    )
    study, study_model = experiment("experiment=study")
    ablation, ablation_model = experiment("experiment=ablation_1b")
    torch_pin = re.search(r"^torch==(\S+)", (ROOT / "constraints/cpu.txt").read_text(), re.M)
    return [
        f"takes the CPU build of torch {torch_pin[1]}",
        f"a tiny xIELU Llama ({model.n_layers} layers, width {model.dim}, UTF-8 byte tokens,"
        f" {millions(count_parameters(model).total)} parameters) trained for {t.steps} steps of"
        f" {t.global_batch} x {seq} tokens",
        f"over the first {v.batches} held-out batches"
        f" ({v.batches * t.global_batch * seq:,} tokens)",
        f"Over {v.batches * t.global_batch * seq:,} held-out tokens, the first"
        f" validation.batches={v.batches} batches",
        f"ln {model.vocab_size} = {math.log(model.vocab_size):.1f}",
        f"padded to {model.vocab_size}",
        f"{tokens_per_run(quick) / 1e6:.0f}M bytes is very little text",
        f"({tekken.total / 1e6:.0f}M parameters, mostly embedding",
        f"Ablation table ({len(jobs('ablation'))} rows,"
        f" {count_parameters(ablation_model).total / 1e9:.1f}B,"
        f" {tokens_per_run(ablation) / 1e9:.0f}B tokens",
        f"({len(jobs('study_lr')) + len(jobs('study_seeds'))} runs,",
        f"{millions(count_parameters(study_model).total)} parameters,"
        f" {millions(tokens_per_run(study))} tokens, {seeds_per_arm('study_seeds')} seeds",
        f"({len(jobs('width_lr'))} + {len(jobs('width_ladder'))} runs",
    ]


def activations_numbers() -> list[str]:
    """Every registered name is listed once under "Registered names", and no other (a list, not
    a phrase: checked here, no phrase returned)."""
    from xielu import available_activations

    text = (ROOT / "docs/activations.md").read_text()
    section = text.split("## Registered names")[1].split("\n|")[0]
    listed = re.findall(r"^[ -].*", section, flags=re.M)
    names = re.findall(r"`(\w+)`", "\n".join(listed))
    assert_same_names("docs/activations.md, Registered names", names, available_activations())
    return []


def assert_same_names(where: str, listed: list[str], actual: list[str]) -> None:
    add, remove = sorted(set(actual) - set(listed)), sorted(set(listed) - set(actual))
    twice = sorted({name for name in listed if listed.count(name) > 1})
    assert not (add or remove or twice), f"{where}: add {add}, remove {remove}, twice {twice}"


def data_numbers() -> list[str]:
    from data import load_tokenizer
    from data.config import DataConfig, TokenizerConfig

    vocab = {n: load_tokenizer(TokenizerConfig(n)).vocab_size for n in ("mistral_nemo", "llama3")}
    defaults = DataConfig()
    return [
        f"`mistral_nemo` (Tekken, vocab {vocab['mistral_nemo']}) and `llama3` (vocab"
        f" {vocab['llama3']})",
        f"UTF-8 bytes, vocab {load_tokenizer(TokenizerConfig('bytes')).vocab_size}",
        f"`data.hub_backoff_s` (default {defaults.hub_backoff_s:g} s",
        f"`data.hub_retries` times in a row (default {defaults.hub_retries})",
    ]


def evaluation_numbers() -> list[str]:
    from data import load_tokenizer
    from data.config import TokenizerConfig
    from scripts.bench import scoring as bench_scoring

    a = parsed_arguments(bench_scoring, [])
    return [
        f"`python -m scripts.bench.scoring` ({a.batch} requests of {a.length} tokens,"
        f" {a.continuation} scored each, Llama 3's {a.vocab:,}-entry vocabulary, dim {a.dim};",
        f"Llama 3's {load_tokenizer(TokenizerConfig('llama3')).vocab_size:,}-entry",
    ]


def fault_tolerance_numbers() -> list[str]:
    from model import count_parameters
    from training.checkpoint.load import IO_RETRIES
    from training.runtime.parallelize import ParallelConfig

    sbatch = (ROOT / "slurm/train.sbatch").read_text()
    warning = int(re.search(r"^#SBATCH --signal=USR1@(\d+)", sbatch, flags=re.M)[1])
    paper_1b = count_parameters(experiment("experiment=paper_1b")[1]).total
    return [
        f"retried on the same checkpoint {times(IO_RETRIES)}",
        f"after {IO_RETRIES} retries set aside",
        f"`parallel.collective_timeout_s` (default {ParallelConfig().collective_timeout_s})",
        f"`--signal=USR1@{warning}` in `slurm/train.sbatch`: the time limit is"
        f" {warning // 60} minutes away",
        f"~{paper_1b * 12 / 1e9:.0f} GB per checkpoint, counted: 12 bytes per parameter",
    ]


NUMBER_WORDS = ["zero", "once", "twice", "three", "four", "five", "six"]


def times(n: int) -> str:
    return NUMBER_WORDS[n] if n in (1, 2) else f"{NUMBER_WORDS[n]} times"


def model_numbers() -> list[str]:
    from model.config import ModelConfig
    from model.presets import available_presets, load_preset
    from xielu import activation_spec

    text = " ".join((ROOT / "docs/model.md").read_text().split())
    listed = re.search(r"`configs/model/\{([\w,]+)\}\.yaml`", text)[1].split(",")
    assert_same_names("docs/model.md, the presets", listed, available_presets())
    paper = {load_preset(name).loss_chunk_tokens for name in available_presets() if name != "tiny"}
    assert len(paper) == 1, "the paper's presets no longer share one loss chunk size"
    layers = load_preset("paper_1b").n_layers
    scalars = activation_spec("xielu").scalars
    assert scalars == ("alpha_p", "alpha_n")
    return [
        f"RoPE (theta {ModelConfig.rope_theta:.0f})",
        f"({paper.pop()} in the paper's presets",
        f"({len(scalars) * layers} more: alpha_p and alpha_n in each of {layers} layers)",
    ]


def bench_activations_shape() -> str:
    from scripts.bench import activations as bench_activations

    return " x ".join(map(str, parsed_arguments(bench_activations, []).shape))


def performance_numbers() -> list[str]:
    from scripts.estimate_memory import DEVICES, HEADROOM

    sizes = " and ".join(re.search(r"(\d+)GB", name)[1] for name in DEVICES)
    return [
        f"(default {bench_activations_shape()})",
        f"{bench_activations_shape()} by default",
        f"against {sizes} GB, less {HEADROOM:.0%} headroom",
    ]


def ladder_row(sweep: str, gpus: int, where: str) -> str:
    """The row of results.md's ladder table, priced as ``scripts.estimate_sweep`` prices it."""
    from scripts.estimate_sweep import MEASURED_MFU, job_cost
    from training.instruments.metrics import PEAK_BF16_FLOPS

    costs = [job_cost(job) for job in jobs(sweep)]
    shapes = list(dict.fromkeys(cost["model"] for cost in costs))
    widths = ", ".join(shape.split("x")[0] for shape in shapes)
    (layers,) = {shape.split("x")[1] for shape in shapes}
    gpu_hours = sum(c["flops"] for c in costs) / (MEASURED_MFU * PEAK_BF16_FLOPS["H100"]) / 3600
    n = seeds(sweep)
    return (
        f"| `{sweep}` | {widths} ({layers}) | {len(costs)} ({n} seed{'s' * (n > 1)}) |"
        f" {gpu_hours:.0f} | {gpu_hours / gpus:.1f} on {where} |"
    )


def results_numbers() -> list[str]:
    from model import count_parameters

    study, model = experiment("experiment=study")
    params = count_parameters(model)
    t, s, v = study.trainer, study.schedule, study.validation
    mini, mini_model = experiment("experiment=mini_ablation")
    width, width_model = experiment("experiment=width")
    width_std = model.init_std * math.sqrt(model.init_reference_dim / model.dim)
    return [
        f"(dim {model.dim}, {model.n_layers} layers, {model.n_heads} heads,"
        f" {millions(params.total)} parameters, {params.embedding / 1e3:.0f}k of them the tied"
        f" embedding; UTF-8 byte tokens, vocabulary {model.vocab_size})",
        f"{t.steps} steps of {t.global_batch} x {study.data.seq_len} tokens,"
        f" {tokens_per_run(study) / 1e6:.2f}M tokens per run; WSD, {s.warmup_steps}"
        f" warmup steps, a {s.decay_shape} cooldown over the last {s.decay_steps}.",
        f"every {v.every} steps on the same"
        f" {v.batches * t.global_batch * study.data.seq_len:,} held-out tokens",
        f"std {model.init_std} x sqrt({model.init_reference_dim} / {model.dim}) = {width_std:.3f}",
        f"--parallel 2 # {len(jobs('study_lr'))} runs",
        f"--parallel 2 # {len(jobs('study_seeds'))} runs",
        f"(dim {mini_model.dim}, {mini_model.n_layers} layers,"
        f" {millions(count_parameters(mini_model).total)} parameters, UTF-8 byte tokens)",
        f"the same {millions(tokens_per_run(mini))} tokens of the builtin corpus"
        f" ({mini.trainer.steps} steps of {mini.trainer.global_batch} x {mini.data.seq_len}, WSD"
        f" with the cooldown in the last {mini.schedule.decay_steps} steps)",
        f"Every run: {width.trainer.steps} steps of {width.trainer.global_batch} x"
        f" {width.data.seq_len} byte tokens ({tokens_per_run(width) / 1e6:.2f}M tokens",
        f"base width {width_model.mup_base_dim},"
        f" init std {width_model.init_std} = 0.78 / sqrt({width_model.mup_base_dim})",
        ladder_row("ladder_h100_tune", 1, "one H100"),
        ladder_row("ladder_h100", 1, "one H100"),
        ladder_row("ladder_gh200_tune", 16, "a 4-node GH200 allocation (16 GPUs)"),
        ladder_row("ladder_gh200", 16, "a 4-node GH200 allocation (16 GPUs)"),
    ]


NUMBERS = {
    "README.md": readme_numbers,
    "docs/activations.md": activations_numbers,
    "docs/data.md": data_numbers,
    "docs/evaluation.md": evaluation_numbers,
    "docs/fault-tolerance.md": fault_tolerance_numbers,
    "docs/model.md": model_numbers,
    "docs/performance.md": performance_numbers,
    "docs/results.md": results_numbers,
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "where",
    # results.md prices every job of four ladders: composed points the group shares
    [
        pytest.param(w, marks=[pytest.mark.xdist_group(SWEEP_POINTS)] * (w == "docs/results.md"))
        for w in NUMBERS
    ],
)
def test_counts_in_the_pages_are_what_the_code_gives(where):
    """Each phrase, its numbers computed from the code today, appears in the page (line breaks
    and runs of spaces read as one space)."""
    text = " ".join((ROOT / where).read_text().split())
    missing = [phrase for phrase in NUMBERS[where]() if phrase not in text]
    assert not missing, f"{where} should read, as the code gives today: {missing}"


# --- links ------------------------------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_point_at_files_and_headings(page):
    prose = FENCE.sub("", page.read_text())
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path) if path else page
        assert file.exists(), f"{page.name}: link {target} points at no file"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", FENCE.sub("", file.read_text()), flags=re.M)
            assert anchor in map(slug, headings), f"{page.name}: {target}: no such heading"
