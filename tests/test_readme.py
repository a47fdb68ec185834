"""The README and docs/ stay true. README's Python examples run as written and do what their
comments say, checked against independent truth (the paper's formulas, autograd, counts by hand)
in the namespace the example leaves behind; the Python examples of docs/*.md run as written; and
every command the pages name can run: its module or script exists, its argument parser accepts
the arguments, and train.py's Hydra overrides compose into a valid configuration."""

import argparse
import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from train_helpers import compose

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
    below (both alphas 0.8 through softplus at init), checked by autograd."""
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
    """The configuration train.py would build from these overrides, or the error it stops with."""
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
    if target.startswith("-m "):
        return check_module(target[3:], args, markers)
    return check_script(target, args, markers)


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


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
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
