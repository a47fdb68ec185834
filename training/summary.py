"""The lines a finished run closes with: did it learn, what does it write, what to run next.

"Did it learn" compares the validation loss with the unigram entropy of the same validation
targets: the loss of a model that knows each token's frequency and nothing else. A loss far
below it means the model predicts from context; a loss near it means it has learned little
more than the token histogram.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterable
from pathlib import Path

import torch

from model import Llama, count_parameters
from model.hf import UnsupportedExportError, hf_activation_name, hf_model_type
from model.sampling import SamplingConfig, document_start, generate
from training.config import ExperimentConfig
from training.instruments.validation import IGNORE_INDEX
from training.runtime import distributed

SAMPLE_PROMPT = "If the"
SAMPLE_SAMPLING = SamplingConfig(temperature=0.5, top_k=20)
SAMPLE_SEED = 0


def target_counts(batches: Iterable[dict], vocab_size: int) -> torch.Tensor:
    """How often each token id is a target in ``batches`` (``IGNORE_INDEX`` excluded), float64
    [vocab_size]: a fixed shape, so every rank's counts can be summed."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for b in batches:
        targets = b["targets"][b["targets"] != IGNORE_INDEX].cpu()
        counts += torch.bincount(targets, minlength=vocab_size)[:vocab_size].double()
    return counts


def entropy_of(counts: torch.Tensor) -> float:
    """H = -sum_t p(t) ln p(t), in nats, of the distribution the counts give; ``nan`` if none."""
    total = counts.sum()
    if total == 0:
        return math.nan
    p = counts[counts > 0].double() / total
    return float(-(p * p.log()).sum())


def validation_entropy(batches: list[dict] | None, model_config, device) -> float:
    """The unigram entropy of the whole validation slice: every rank's share of it (a
    collective: every rank calls it)."""
    counts = target_counts(batches or [], model_config.vocab_size)
    return entropy_of(torch.tensor(distributed.all_reduce_sum(counts.tolist(), device)))


def unigram_entropy(batches: Iterable[dict]) -> float:
    """The entropy, in nats per token, of the empirical distribution of the batches' targets
    (``IGNORE_INDEX`` excluded). ``nan`` when there are no targets."""
    batches = list(batches)
    targets = [b["targets"][b["targets"] != IGNORE_INDEX] for b in batches]
    vocab = 1 + max((int(t.max()) for t in targets if t.numel()), default=-1)
    return entropy_of(target_counts(batches, vocab)) if vocab else math.nan


def last_validation(run_dir: str | Path) -> dict | None:
    """The newest validation record the run logged to ``metrics.jsonl`` (``val/loss``, and
    ``val/tokens``: what it covers)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return None
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records = [r for r in records if "val/loss" in r]
    return records[-1] if records else None


def coverage(
    tokens: int | None, eval_batches: int, run_dir: str | Path, per_source: bool = False
) -> str:
    """What a logged validation loss covers: all of the held-out slice, or a part of it (a
    mixture holds out and validates each source on its own: batches per source)."""
    if tokens is None:
        return ""
    if not eval_batches:
        return f". Over the whole held-out slice ({tokens:,} tokens)."
    unit = "source and rank" if per_source else "rank"
    return (
        f". Over {tokens:,} held-out tokens, the first validation.batches={eval_batches} "
        f"batches per {unit}; python -m eval.perplexity {run_dir} scores the whole slice."
    )


def validation_lines(record: dict, config: ExperimentConfig, run_dir: str | Path) -> list[str]:
    """What the validation ``record`` covers and, for a mixture, each source's loss in it."""
    names = [entry.name for entry in config.data.sources]
    lines = [coverage(record.get("val/tokens"), config.validation.batches, run_dir, bool(names))]
    parts = [
        f"{name} {record[f'val/loss/{name}']:.3f} ({record[f'val/tokens/{name}']:,} tokens)"
        for name in names
        if f"val/loss/{name}" in record
    ]
    if parts:
        lines.append(f"validation loss per source, nats/token: {', '.join(parts)}")
    return lines


def why_no_validation(config: ExperimentConfig) -> str:
    """Why a finished run logged no validation loss, from its settings."""
    if not config.data.validation_documents:
        return "data.validation_documents=0 holds no text out"
    if not config.validation.every:
        return "validation.every=0"
    return "no validation step was reached"


def loss_line(
    val_loss: float | None, entropy: float, tokenizer_name: str, why_none: str = ""
) -> str:
    """The loss beside the entropy, in words that follow the sign of the difference:
    "predicts from context" once it is below 80% of it, "little below" between, "above" when
    the model does worse than token frequencies alone; the loss alone when the entropy is not
    known, and ``why_none`` when there is no loss."""
    if val_loss is None:
        return f"validation loss: none logged ({why_none or 'no validation step was reached'})"
    unit = f" ({val_loss / math.log(2):.2f} bits per byte)" if tokenizer_name == "bytes" else ""
    if not math.isfinite(entropy):
        return f"validation loss {val_loss:.3f} nats/token{unit}"
    if val_loss < 0.8 * entropy:
        verdict = "the model predicts from context, not only from token frequencies"
    elif val_loss < entropy:
        verdict = "little below what token frequencies alone give: train longer or with a higher lr"
    else:
        verdict = (
            "above what token frequencies alone give: the model has not yet learnt even which "
            "tokens are common; train longer or with a higher lr"
        )
    return (
        f"validation loss {val_loss:.3f} nats/token{unit} vs {entropy:.3f} for the unigram "
        f"entropy of the same text: {verdict}"
    )


def sample_line(model: Llama, tokenizer, add_bos: bool, max_new_tokens: int) -> str:
    """A seeded low-temperature continuation of ``SAMPLE_PROMPT``, as one line."""
    if any(hasattr(p, "to_local") for p in model.parameters()):
        # FSDP shards: a forward needs every rank, and this runs on rank 0 alone
        return "sample: skipped (the model is sharded); use python -m eval.generate"
    was_training = model.training
    model.eval()
    try:
        bos = tokenizer.bos_id if add_bos else None
        prompt = document_start(tokenizer.encode(SAMPLE_PROMPT), tokenizer.eos_id, bos)
        # a compiled model would recompile for every cache length: run it eagerly
        with torch.compiler.set_stance("force_eager"):
            (generation,) = generate(
                model,
                [prompt],
                max_new_tokens,
                SAMPLE_SAMPLING,
                eos_id=tokenizer.eos_id,
                seed=SAMPLE_SEED,
                vocab_limit=tokenizer.vocab_size,
            )
    except Exception as error:  # a finished run must not fail on its closing lines
        return f"sample: not drawn ({type(error).__name__}: {error})"
    finally:
        model.train(was_training)
    text = SAMPLE_PROMPT + tokenizer.decode(generation.tokens)
    s = SAMPLE_SAMPLING
    return f"sample (temperature {s.temperature}, top-k {s.top_k}): {json.dumps(text)}"


def next_commands(run_dir: str | Path, config: ExperimentConfig) -> list[str]:
    run = shlex.quote(str(run_dir))
    prompt = shlex.quote(SAMPLE_PROMPT)
    lines = [
        "next:",
        f"  plot the curves   python -m scripts.plot_curves {run}/curves.png {run}",
        f"  evaluate          python -m eval.perplexity {run}",
        f"  sample            python -m eval.generate {run} --prompt {prompt}",
    ]
    try:
        hf_model_type(config.model)
        hf_activation_name(config.model)
        lines.append(
            f"  export            python -m scripts.export_hf {run}/hf --run-dir {run} --check"
        )
    except UnsupportedExportError:
        lines.append(f"  export            ({config.model.activation} has no transformers class)")
    lines.append(
        "  the paper's runs  torchrun --nproc_per_node=4 train.py experiment=paper_1b "
        f"activation={config.model.activation} data.paths='[/path/to/fineweb-edu/*.parquet]'"
    )
    return lines


def run_summary(
    model: Llama,
    tokenizer,
    validation_batches: list[dict] | None,
    run_dir: str | Path,
    config: ExperimentConfig,
    val_loss: float | None = None,
    max_new_tokens: int = 100,
    entropy: float | None = None,
) -> list[str]:
    """The closing lines of a run (rank 0 only: no collectives).

    ``model`` is the bare ``Llama``; ``val_loss`` defaults to the newest one in the run's
    ``metrics.jsonl``; ``entropy`` to that of ``validation_batches``' targets (the trainer
    passes the one of every rank's share: ``target_counts`` summed over ranks).
    """
    last: dict = {}
    if val_loss is None:
        last = last_validation(run_dir) or {}
        val_loss = last.get("val/loss")
    if entropy is None:
        entropy = unigram_entropy(validation_batches or [])
    covered, *per_source = validation_lines(last, config, run_dir) if val_loss else [""]
    return [
        loss_line(val_loss, entropy, tokenizer.name, why_no_validation(config)) + covered,
        *per_source,
        sample_line(model, tokenizer, config.data.tokenizer.add_bos, max_new_tokens),
        *next_commands(run_dir, config),
    ]


def closing_summary(trainer) -> None:
    """Print the closing lines of a finished run (a collective: every rank calls it)."""
    # read here if no measurement read them (a resume that validated nothing since)
    batches = trainer.measure.held_out() if trainer.config.data.validation_documents else []
    entropy = validation_entropy(batches, trainer.model_config, trainer.env.device)
    if trainer.env.is_main:
        lines = run_summary(
            trainer.model.bare,
            trainer.tokenizer,
            batches,
            trainer.run_dir,
            trainer.config,
            entropy=entropy,
        )
        print("\n".join(lines), flush=True)  # the user's closing screen, not a log


def opening_line(trainer) -> str:
    """What is being trained, on what, with what batch: the run's first log line."""
    c, env, model_config = trainer.config, trainer.env, trainer.model_config
    params = count_parameters(model_config)
    batch, accumulation = trainer.plan.at(trainer.step)  # the resumed step's, with a ramp
    return (
        f"{c.name}: {c.model.activation}, {params.total / 1e6:.1f}M parameters "
        f"(vocab {model_config.vocab_size}), {env.world_size} x {env.device.type}, "
        f"{c.parallel.strategy if env.distributed else 'single process'}, "
        f"global batch {batch} x {c.data.seq_len} tokens (accumulation {accumulation})"
        f"{' (trainer.batch_ramp)' if c.trainer.batch_ramp else ''}, {c.trainer.steps} steps "
        f"-> {trainer.run_dir}"
    )
