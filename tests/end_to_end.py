"""The end-to-end tier's cases: each shipped experiment as shipped but small, every instrument on.

``shrunk(experiment, run_dir)`` is the one size override of the tier: it sets only sizes,
lengths and cadences (dims, layers, heads, sequence, batch, steps, warmup/decay, evaluation and
checkpoint cadence, evaluation batches, validation documents), so parallelism, precision,
compile, activation checkpointing, schedule shape, tokenizer and vocabulary stay the preset's
own. Presets that read local files get C4-layout files of real text (``data_fixtures.c4_corpus``);
the others keep the builtin corpus. ``instruments()`` turns on everything a researcher can turn on.

The cadences are chosen so that step ``STOP`` is a validation, downstream, diagnostics,
gradient-norm and checkpoint step at once: the interruption the tier sends lands on all of them.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from benchmark_fixtures import benchmark_files
from data_fixtures import c4_corpus
from hf_fixtures import apertus_checkpoint
from train_helpers import CONFIGS

LOCAL_CORPUS = c4_corpus()
INITIAL_HF = apertus_checkpoint()  # what a preset that starts from published weights reads
EVAL_DATA = benchmark_files()

STEPS = 8
STOP = 4  # validation, downstream, diagnostics, gradient norms, outliers, a checkpoint: here
EVERY = 4
GRAD_NORMS_EVERY = 2
WARMUP, DECAY = 2, 3  # wsd: the stable phase ends at step 5, another validation point
PROFILE = (2, 3)  # before STOP: the resumed run does not profile again
RAMP_TOKENS = STOP * 4 * 32  # a batch ramp's stage starts at STOP: 4 sequences of 32 a step

EXPERIMENTS = sorted(path.stem for path in (CONFIGS / "experiment").glob("*.yaml"))


def experiment_text(experiment: str) -> str:
    """The experiment's YAML and, after it, that of every experiment it builds on
    (``- /experiment/NAME`` in its defaults)."""
    text = (CONFIGS / "experiment" / f"{experiment}.yaml").read_text()
    parents = re.findall(r"^\s*-\s*/experiment/(\w+)", text, flags=re.MULTILINE)
    return "\n".join([text, *(experiment_text(parent) for parent in parents)])


def reads_local_files(experiment: str) -> bool:
    return "override /data: local" in experiment_text(experiment)


def starts_from_published_weights(experiment: str) -> bool:
    return "override /model: from_checkpoint" in experiment_text(experiment)


def shrunk(experiment: str, run_dir: Path) -> list[str]:
    """``experiment`` with sizes, lengths and cadences only made small (grouped-query attention
    keeps its groups: one key/value head for the 2 query heads; Goldfish hashes 4 ids, not 50,
    so that it drops targets in windows of 32)."""
    values = {
        "experiment": experiment,
        "model.dim": 32,
        "model.n_layers": 2,
        "model.n_heads": 2,
        "model.gated_hidden": 64,
        "model.max_seq_len": 64,
        "data.seq_len": 32,
        "data.validation_documents": 8,
        "trainer.global_batch": 4,  # 2 ranks x 1 sequence x 2 accumulated micro-batches
        "trainer.micro_batch": 1,
        "trainer.steps": STEPS,
        "schedule.warmup_steps": WARMUP,
        "schedule.decay_steps": DECAY,
        "trainer.log_every": 1,
        "validation.every": EVERY,
        "validation.batches": 1,
        "checkpoint.every": EVERY,
        "trainer.run_dir": str(run_dir),
        # not a size, the one other change: Dynamo and AOTAutograd trace the preset's graphs
        # as on a GPU, without Inductor's C++ build, most of a compiled run's time on 2 cores
        "parallel.compile_backend": "aot_eager",
    }
    if reads_local_files(experiment):
        values["data.paths"] = f"[{LOCAL_CORPUS}/*.json.gz]"
    if starts_from_published_weights(experiment):  # the checkpoint's sizes are already small
        values = {k: v for k, v in values.items() if not k.startswith("model.")}
        values["checkpoint.initial_hf"] = str(INITIAL_HF)
    text = experiment_text(experiment)
    if "n_kv_heads" in text:
        values["model.n_kv_heads"] = 1
    if "override /recipe: apertus" in text:  # Goldfish
        values["loss.goldfish_h"] = 4
    if "batch_ramp" in text:  # the batch doubles at the stop: the first step after it
        values["trainer.batch_ramp"] = f"[{{tokens: {RAMP_TOKENS}, global_batch: 8}}]"
    return [f"{key}={value}" for key, value in values.items()]


def instruments() -> list[str]:
    """Everything measured besides the loss, on: validation (``shrunk``), in-loop downstream
    on local tasks, diagnostics, per-layer gradient norms, outlier telemetry, the spike
    monitor skipping spikes, z-loss and the profiler. wandb stays off: it is a sink, tested on
    its own (``tests/test_train.py``), and the tier reads ``metrics.jsonl``."""
    values = {
        "downstream.every": EVERY,
        "downstream.tasks": "[piqa]",
        "downstream.limit": 4,
        "downstream.data": str(EVAL_DATA),
        "logging.diagnostics_every": EVERY,
        "logging.grad_norms_every": GRAD_NORMS_EVERY,
        "logging.outliers_every": EVERY,
        "spikes.window": 4,
        "spikes.threshold": 3.0,
        "spikes.skip": "true",
        "spikes.skip_limit": 3,
        "loss.z_loss": 1e-4,
        "profile.steps": f"[{PROFILE[0]},{PROFILE[1]}]",
        "logging.wandb.mode": "disabled",
        "spikes.max_bad_steps": 3,
        "parallel.collective_timeout_s": 600,
        "trainer.seed": 1,
        # a 2-core CPU's peak, about 2 cores x 3 GHz x 32 fp32 FLOPs a cycle (AVX2 FMA): no
        # table knows a CPU's, and the tier's runs log the MFU a GPU's would
        "logging.peak_flops": 2e11,
    }
    return [f"{key}={value}" for key, value in values.items()]


def expected_steps(schedule: str, stable_end: int = STEPS - DECAY) -> dict[str, list[int]]:
    """At which steps each instrument logs in a run of the tier (interrupted or not);
    ``stable_end``: where the WSD cooldown starts (later under a batch ramp, which reads the
    schedule in tokens)."""
    validation = [EVERY, stable_end, STEPS] if schedule == "wsd" else [EVERY, STEPS]
    return {
        "loss": list(range(1, STEPS + 1)),
        "val/loss": sorted(set(validation)),
        "downstream/seconds": list(range(EVERY, STEPS + 1, EVERY)),  # not in the matrix
        "diag/pre_rms/layer_00": list(range(0, STEPS + 1, EVERY)),
        "grad_norm/mlp/layer_00": list(range(GRAD_NORMS_EVERY, STEPS + 1, GRAD_NORMS_EVERY)),
        "outliers/act_out/kurtosis/layer_00": list(range(EVERY, STEPS + 1, EVERY)),
    }


# The matrix beyond the presets: {DDP, FSDP2} x {fp32, bf16} x {compile none, blocks, model} x
# {activation checkpointing none, selective, full}. FSDP2 + bf16, the cluster's setting, with
# every compile and checkpointing option (a defect of a triple that pairs alone
# miss); three more points cover every remaining pair of values together with the presets.
PRESETS_COVER = {  # experiment -> (parallelism, precision on this CPU, compile, checkpointing)
    "quickstart": ("ddp", "fp32", "none", "none"),
    "ablation_1b": ("ddp", "bf16", "blocks", "none"),
    "paper_1b": ("fsdp", "bf16", "blocks", "selective"),
    "apertus_1b": ("fsdp", "bf16", "blocks", "selective"),  # paper_1b's, under the recipe
    "paper_3b": ("fsdp", "bf16", "blocks", "full"),
    "mixture_ramp": ("fsdp", "bf16", "none", "none"),
    "continued": ("fsdp", "bf16", "blocks", "selective"),  # from a tiny Apertus's weights
}
COMPILE = ("none", "blocks", "model")
CHECKPOINTING = ("none", "selective", "full")
MATRIX = [
    *(
        ("fsdp", "bf16", c, a)
        for c, a in itertools.product(COMPILE, CHECKPOINTING)
        if ("fsdp", "bf16", c, a) not in PRESETS_COVER.values()
    ),
    ("ddp", "fp32", "model", "full"),
    ("fsdp", "fp32", "blocks", "selective"),
    ("ddp", "bf16", "none", "selective"),
]


# settings of the trainer that only these points exercise (each also covers a trainer field)
MATRIX_EXTRAS = {
    ("fsdp", "fp32", "blocks", "selective"): {
        "parallel.fsdp_reshard_after_forward": "false",
        "parallel.fsdp_reduce_every_micro_batch": "true",
        "checkpoint.async_write": "true",
    },
    ("ddp", "bf16", "none", "selective"): {
        "trainer.global_batch_tokens": 4 * 32,  # the same 4 sequences, given in tokens
    },
    # xIELU on the traced path (xielu.fused.ops.TracedPiecewise) inside compiled FSDP2 bf16
    # blocks: its losses follow the quickstart's custom-op run like every point's
    ("fsdp", "bf16", "blocks", "none"): {
        "+model.activation_kwargs.backend": "traced",
    },
}


MATRIX_LEAVES_OUT = ("trainer.downstream_", "profile.steps")

# A run moves between world sizes: one point of the matrix per {DDP, FSDP2} x fp32 and DDP x
# bf16 trains on 2 processes until SIGTERM at MOVES[0], on 1 until MOVES[1], on 2 to the end
# (2 -> 1, 1 -> 2, 2 -> 1 -> 2); the FSDP2 presets' (bf16) resumed run stops at MOVES[1] and
# one process finishes it.
MOVED = (
    ("ddp", "fp32", "model", "full"),
    ("fsdp", "fp32", "blocks", "selective"),
    ("ddp", "bf16", "none", "selective"),
)
MOVED_PRESETS = ("apertus_1b", "continued", "mixture_ramp", "paper_1b", "paper_3b")
MOVES = (3, 6)


def matrix_overrides(point: tuple[str, str, str, str], run_dir: Path) -> list[str]:
    """The quickstart, shrunk and fully instrumented, at one point of the matrix."""
    parallelism, precision, compile_scope, checkpointing = point
    values = {
        "parallel.strategy": parallelism,
        "parallel.precision": precision,
        "parallel.compile": compile_scope,
        "parallel.activation_checkpointing": checkpointing,
        **MATRIX_EXTRAS.get(point, {}),
    }
    extra = [f"{key}={value}" for key, value in values.items()]
    # downstream and the profiler run in every preset's case already; here each would add its
    # start-up cost (lm-eval's task index, the profiler) to 10 launches for no new pair
    light = [o for o in instruments() if not o.startswith(MATRIX_LEAVES_OUT)]
    return shrunk("quickstart", run_dir) + light + extra
