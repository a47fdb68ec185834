"""The trainer's configuration schema: dataclasses registered in Hydra's ConfigStore.

Hydra YAML files only set values; these dataclasses say what exists, its type and meaning. An
unknown key or a wrong type fails at composition, and so does a model or data value that cannot
work (their dataclasses check themselves); ``training.checks.check_config`` then checks
everything else, before any model is built or any file written.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass

from data.config import DataConfig
from data.sources import check_sources
from model.config import ModelConfig
from training.errors import ConfigError


@dataclass
class OptimConfig:
    """AdamW (paper: betas 0.9/0.95, eps 1e-8, weight decay 0.1 main / 0.01 ablations), or
    AdEMAMix (``training/ademamix.py``; the Apertus models: betas 0.9/0.999, alpha 8, beta3
    0.9999, both warmups 100,000 steps).

    Attributes:
        name: ``adamw`` (the paper), ``ademamix`` or ``muon`` (``training/muon.py``: Muon for
            the attention and MLP matrices at ``muon_lr``, AdamW for every other parameter at
            ``lr``, both on the schedule's shape). ``lr``, ``betas`` (beta1, beta2), ``eps``,
            the weight decay and its roles, the scalar multiplier and µP's per-group rates mean
            the same under both. A resume may not change it (the state is another optimizer's).
        goldfish_k: Goldfish loss (``training/loss_mask.py``): leave out of the training loss
            the targets whose ``goldfish_h`` preceding ids hash into a 1/k bucket (Apertus: 50);
            0 (the paper) leaves none out; 1 would leave out all and is refused.
        goldfish_h: how many token ids Goldfish hashes (Apertus: 50).
        goldfish_rule: ``table`` (the code Apertus trained with: the product of the ``h``
            labels ending at the target, looked up in a seeded table) or ``paper`` (a hash of
            the ``h`` ids before the target, the paper's wording); ``training/loss_mask.py``.
        eod_mask_loss: leave out of the training loss the positions whose input is the
            end-of-document token (Megatron's ``--eod-mask-loss``; Apertus: on).
            With either mask the training loss is the mean over the counted targets of the
            whole global batch; validation and evaluation count every target.
        ademamix_alpha: AdEMAMix's weight on its slow average (Apertus: 8).
        ademamix_beta3: the slow average's decay (Apertus: 0.9999, a half-life of ~6,900
            steps; a run should be several half-lives long for it to matter).
        ademamix_alpha_warmup: steps over which alpha rises linearly from 0 (0: none).
        ademamix_beta3_warmup: steps over which beta3 rises from beta1 with its half-life
            growing linearly (0: none).
        muon_lr: Muon's peak rate for the hidden matrices (an update of spectral norm
            ``muon_lr * sqrt(max(1, fan_out / fan_in))``; µP needs no width factor on it).
        muon_momentum: Muon's (Nesterov) momentum.
        lr: peak learning rate.
        min_lr: the learning rate the schedule decays to.
        decay_norms_and_embeddings: apply weight decay to norm weights and the embedding too
            (default off: decay on scale parameters pulls them to zero for no benefit).
        decay_activation_scalars: apply weight decay to alpha_p / alpha_n / trainable beta
            (default off, as in the Megatron xIELU runs: decay would pull the softplus-raw alphas
            towards softplus(0) = 0.69 rather than towards "no activation").
        scalar_lr_multiplier: the activation scalars' learning rate over the schedule's (1: the
            paper). Adam moves a scalar by about lr per step, so a short run (the CPU study sums
            ~1 of lr over its steps, the paper's 1.1B ~47) leaves the alphas near their
            initialisation; a multiplier lets them reach their regime in fewer steps.
        z_loss: coefficient of the z-loss ``z * logsumexp(logits)^2`` (PaLM uses 1e-4), added to
            the training loss inside the fused LM-head loss (``model/loss.py``); 0, the paper,
            adds nothing. The logged training loss includes it; validation never does.
        grad_clip: global gradient-norm clip; 0 disables; negative values are refused.
        fused: torch's fused AdamW kernel (CUDA and CPU); ``None`` picks it on CUDA.
    """

    name: str = "adamw"
    lr: float = 3e-3
    min_lr: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_norms_and_embeddings: bool = False
    decay_activation_scalars: bool = False
    scalar_lr_multiplier: float = 1.0
    z_loss: float = 0.0
    goldfish_k: int = 0
    goldfish_h: int = 50
    goldfish_rule: str = "table"
    eod_mask_loss: bool = False
    grad_clip: float = 1.0
    fused: bool | None = None
    ademamix_alpha: float = 8.0
    ademamix_beta3: float = 0.9999
    ademamix_alpha_warmup: int = 0
    ademamix_beta3_warmup: int = 0
    muon_lr: float = 0.02
    muon_momentum: float = 0.95

    @property
    def tuned_rate(self) -> str:
        """The setting a rate sweep of this optimizer varies and a µP ladder carries from its
        tuning sweep (``eval/tuning.py``): ``optim.muon_lr`` under Muon (the rate of the
        attention and MLP matrices, nearly every parameter), ``optim.lr`` otherwise."""
        return "optim.muon_lr" if self.name == "muon" else "optim.lr"


@dataclass
class ScheduleConfig:
    """Attributes:
    name: a schedule registered in ``training/schedule.py`` (``register_schedule``): ``wsd``
        (warmup-stable-decay, the paper's main runs) or ``cosine`` (its ablations); ``check_config``
        asks that registry, so a name unknown to it is refused at start-up.
    warmup_steps: linear warmup: step k (0-based) runs at ``lr * (k + 1) / warmup_steps``, so
        the first step takes ``lr / warmup_steps`` (none at 0) and step ``warmup_steps - 1``
        the peak (``training/schedule.py``).
    decay_steps: ``wsd``: length of the cooldown at the end of the run (paper: 14500 of
        70000); ``cosine``: ignored (it decays over all steps after warmup).
    decay_shape: ``wsd`` cooldown: ``1-sqrt`` (paper), ``linear`` or ``cosine`` (checked by
        the wsd schedule itself; other schedules ignore it).
    """

    name: str = "wsd"
    warmup_steps: int = 10
    decay_steps: int = 20
    decay_shape: str = "1-sqrt"


# what makes two runs different experiments rather than one run resumed (``training/axes.py``)
DEFAULT_AXES = (
    "model.activation",
    "model.init_scaling",
    "model.parametrization",
    "model.mup_base_dim",
    "optim.lr",
    "optim.scalar_lr_multiplier",
    "trainer.seed",
    "data.seed",
)


@dataclass
class RampStage:
    """One stage of ``trainer.batch_ramp``: from the first optimizer step that starts with at
    least ``tokens`` training tokens consumed, the global batch is ``global_batch`` sequences."""

    tokens: int = 0
    global_batch: int = 1


@dataclass
class TrainerConfig:
    """Attributes:
    steps: optimizer steps in the run.
    global_batch: sequences per optimizer step over all ranks (paper: 440 at 1.1B, 640 at 3B,
        80 in the ablations); gradient accumulation = global / (micro_batch * world size).
    global_batch_tokens: the global batch in tokens instead (e.g. 1_802_240 = 440 x 4096); a
        multiple of ``data.seq_len``; when set it replaces ``global_batch``.
    micro_batch: sequences per rank per forward/backward.
    batch_ramp: the global batch grows (or changes) during the run: ``[{tokens: T,
        global_batch: B}, ...]``, token counts increasing; before the first ``T`` the batch is
        ``global_batch`` (or ``global_batch_tokens``). With a ramp the learning-rate schedule
        follows the tokens consumed, not the steps (``training/batch_ramp.py``). Empty: one
        batch for the whole run.
    parallelism: ``ddp`` or ``fsdp`` (FSDP2 ``fully_shard`` per block, then the root).
    precision: ``auto`` (bf16 autocast on CUDA, fp32 on CPU), ``bf16`` or ``fp32``.
    compile: ``none``, ``blocks`` (``torch.compile`` each block) or ``model`` (the whole
        model as one graph).
    compile_backend: what ``torch.compile`` hands the traced graphs to, for everything the run
        compiles: ``inductor`` (generated kernels: the speed), ``aot_eager`` (Dynamo and
        AOTAutograd trace the same graphs, which run eagerly: no code generation, whose C++
        build dominates a small run on a CPU; the tests' end-to-end tier uses it) or ``eager``
        (Dynamo alone). Like torchtitan's ``compile.backend``.
    activation_checkpointing: ``none``, ``full`` (recompute each block in backward) or
        ``selective`` (keep matmul and attention outputs, recompute the pointwise work).
    float8: ``none``, ``tensorwise`` or ``rowwise``: the linear layers' matmuls in FP8 through
        torchao (``pip install -e '.[fp8]'``; a GPU with compute capability 8.9+, bf16), one
        scale per tensor or per row; ``training/runtime/float8.py``.
    float8_keep: linear layers that stay bf16 under ``float8``, by name or name suffix
        (``lm_head``: the fused loss reads its weight; e.g. ``down_proj`` too).
    float8_auto_filter: also keep in bf16 the layers FP8 would not speed up (torchao's size
        thresholds for the recipe) or cannot take (a dimension not a multiple of 16).
    fsdp_reshard_after_forward: FSDP2: free each block's gathered weights after its forward
        (least memory) or keep them until its backward (one all-gather less per block).
    fsdp_reduce_every_micro_batch: FSDP2 with gradient accumulation: reduce-scatter the
        gradients after every micro-batch instead of keeping them whole, in fp32, until the
        last one: 4 bytes per parameter less on every GPU (4.2 GiB at 1.1B, 11.2 at 3B) for one
        reduce-scatter per micro-batch instead of per step.
    See ``training/runtime/parallelize.py`` for how these are applied.
    seed: model initialisation and everything else random.
    run_dir: where checkpoints, metrics.jsonl and the resolved config go.
    axes: the keys that say which run a run directory holds: written to ``axes.json`` in it,
        and a resume may not change them (``training/resume_rules.py``); ``scripts.sweep`` adds
        the keys it varies.
    allow_changes: keys that a resume may not change (``training/resume_rules.py``: the
        model's, the data's, the axes) that this start changes on purpose, e.g.
        ``[data.paths]`` after moving the files; empty: every such change is refused.
    checkpoint_every: steps between checkpoints (and one at the end); 0: only at the end.
    async_checkpoint: write checkpoints in the background while training goes on (the weights
        are first copied to CPU memory); published, as synchronous ones, only once complete.
    keep_checkpoints: how many recent checkpoints to keep.
    eval_every: steps between validation passes; 0 disables.
    eval_batches: validation batches per pass and rank (of micro_batch sequences); 0: the whole
        slice, the only setting whose numbers compare across world sizes.
    log_every: steps between console / metrics lines.
    max_bad_steps: stop after this many consecutive steps with a non-finite loss or gradient.
    spike_window: steps of the rolling window a step's loss and gradient norm are compared
        with (``training/instruments/spikes.py``); 0 disables the monitor. Spikes are counted
        (``spikes``) and reported with their step and value.
    spike_threshold: how many standard deviations above the window's mean make a spike.
    spike_skip: skip the update of a spike step (counted in ``skipped_steps``); off by default.
    spike_skip_limit: with ``spike_skip``, this many spikes in a row are a new level, not a
        burst: the step is applied and their values join the window, so a lasting shift (a
        learning-rate change) never freezes the run (``training/step_health.py``).
    downstream_every: steps between downstream evaluations with lm-eval (``eval.downstream``:
        every rank scores its share of the documents), and at the end; 0 disables.
        Logged as ``downstream/<task>/<metric>`` beside ``val/loss``, with the call's cost in
        ``downstream/seconds``.
    downstream_tasks: lm-eval task names (the paper's multiple-choice tasks by default; with
        ``downstream_data`` the local copies of the same names are used).
    downstream_limit: documents per task and evaluation (None: all).
    downstream_data: a directory of the benchmarks' published files, as ``python -m
        eval.fetch_benchmarks DIR`` writes them, to build lm-eval tasks from offline
        (``eval.local_tasks``); empty: lm-eval's own tasks, which download their data from the
        Hugging Face Hub.
    profile_steps: ``[first, last]``: profile those steps (as logged, from 1) into
        ``<run_dir>/profile/`` (``training/instruments/profiling.py``: a Chrome trace per rank; on
        CUDA a memory snapshot too); empty: no profiling.
    collective_timeout_s: how long a collective waits for the slowest rank before the job
        fails (a rank that hangs); a rank that dies stops the others at once (torchrun).
    """

    steps: int = 100
    global_batch: int = 8
    global_batch_tokens: int | None = None
    micro_batch: int = 8
    batch_ramp: list[RampStage] = field(default_factory=list)
    parallelism: str = "ddp"
    precision: str = "auto"
    compile: str = "none"
    compile_backend: str = "inductor"
    activation_checkpointing: str = "none"
    float8: str = "none"
    float8_keep: list[str] = field(default_factory=lambda: ["lm_head"])
    float8_auto_filter: bool = True
    fsdp_reshard_after_forward: bool = True
    fsdp_reduce_every_micro_batch: bool = False
    seed: int = 0
    # deterministic, so that rerunning the same command (a requeued SLURM job) resumes
    run_dir: str = "runs/${name}-${model.activation}"
    axes: list[str] = field(default_factory=lambda: list(DEFAULT_AXES))
    allow_changes: list[str] = field(default_factory=list)
    checkpoint_every: int = 50
    async_checkpoint: bool = False
    keep_checkpoints: int = 2
    eval_every: int = 50
    eval_batches: int = 4
    log_every: int = 10
    max_bad_steps: int = 5
    spike_window: int = 100
    spike_threshold: float = 6.0
    spike_skip: bool = False
    spike_skip_limit: int = 5
    downstream_every: int = 0
    downstream_tasks: list[str] = field(
        default_factory=lambda: ["piqa", "arc_easy", "arc_challenge", "hellaswag", "winogrande"]
    )
    downstream_limit: int | None = 200
    downstream_data: str = ""
    profile_steps: list[int] = field(default_factory=list)
    collective_timeout_s: int = 1800


@dataclass
class WandbConfig:
    """``mode``: ``online``, ``offline`` (files only, sync later: works with no network) or
    ``disabled``; ``WANDB_MODE`` in the environment, when set, takes its place."""

    mode: str = "offline"
    project: str = "xielu"
    entity: str | None = None
    name: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class LoggingConfig:
    """Attributes:
    diagnostics_every: steps between the per-layer activation diagnostics (the MLP
        pre-activation RMS, its fraction below zero, the output RMS and the non-linear share
        of the output; ``training/instruments/diagnostics.py``), measured on one fixed held-out
        batch, also at step 0; 0 disables. Each costs one forward of ``trainer.micro_batch``
        sequences.
    grad_norms_every: steps between the per-layer gradient norms (attention, MLP and the
        activation's scalars of every block, before clipping;
        ``training/instruments/grad_norms.py``), logged as ``grad_norm/<group>/layer_NN``; 0
        disables.
    outliers_every: steps between the per-layer outlier telemetry (kurtosis, max/RMS and the
        FP8 scaling units' maxima of the MLP's pre-activation and output, the attention output
        and the residual stream; ``training/instruments/outliers.py``), on that step's own
        micro-batches, logged as ``outliers/<tensor>/<statistic>/layer_NN``; 0 disables. That
        step's forward runs eagerly.
    """

    wandb: WandbConfig = field(default_factory=WandbConfig)
    diagnostics_every: int = 50
    grad_norms_every: int = 50
    outliers_every: int = 50


@dataclass
class ExperimentConfig:
    """The whole run: what ``train.py`` composes from ``configs/``."""

    name: str = "run"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @property
    def sequences_per_step(self) -> int:
        """The global batch in sequences: ``trainer.global_batch_tokens / data.seq_len`` when
        the batch is given in tokens, else ``trainer.global_batch``. Computed, never written
        back, so the config stays what was asked for."""
        t = self.trainer
        if t.global_batch_tokens is not None:
            return t.global_batch_tokens // self.data.seq_len
        return t.global_batch


CHOICES = {
    "model.init_scaling": ("fixed", "width"),
    "trainer.parallelism": ("ddp", "fsdp"),
    "trainer.precision": ("auto", "bf16", "fp32"),
    "trainer.compile": ("none", "blocks", "model"),
    "trainer.compile_backend": ("inductor", "aot_eager", "eager"),
    "trainer.activation_checkpointing": ("none", "full", "selective"),
    "trainer.float8": ("none", "tensorwise", "rowwise"),
    "optim.name": ("adamw", "ademamix", "muon"),
    "optim.goldfish_rule": ("table", "paper"),
    "logging.wandb.mode": ("online", "offline", "disabled"),
}


# the smallest value of each of the trainer's numeric knobs (the model's, the data's and the
# schedule's are checked with their keys: model/config.py, data/config.py, training/schedule.py);
# every float is also checked finite, by one rule for all (check_finite)
BOUNDS = {
    "trainer.steps": 1,
    "trainer.global_batch": 1,
    "trainer.micro_batch": 1,
    "trainer.log_every": 1,
    "trainer.keep_checkpoints": 1,
    "trainer.checkpoint_every": 0,
    "trainer.eval_every": 0,
    "trainer.eval_batches": 0,
    "trainer.max_bad_steps": 1,
    "trainer.spike_window": 0,
    "trainer.spike_skip_limit": 1,
    "trainer.downstream_every": 0,
    "trainer.collective_timeout_s": 1,
    "logging.diagnostics_every": 0,
    "logging.grad_norms_every": 0,
    "logging.outliers_every": 0,
    "optim.goldfish_k": 0,
    "optim.goldfish_h": 1,
    "optim.weight_decay": 0,
    "optim.z_loss": 0,
    "optim.grad_clip": 0,
    "optim.ademamix_alpha": 0,
    "optim.ademamix_alpha_warmup": 0,
    "optim.ademamix_beta3_warmup": 0,
}
# the float knobs that must be above 0, not only at or above it
POSITIVE = (
    "optim.lr",
    "optim.muon_lr",
    "optim.eps",
    "optim.scalar_lr_multiplier",
    "trainer.spike_threshold",
)
# what a refusal of these adds to "must be ...", for a rule whose reason is not plain
WHY = {
    "optim.lr": "0 trains nothing",
    "optim.eps": "Adam divides by sqrt(v) + eps",
    "optim.grad_clip": "0: no clipping; a negative clip climbs the gradient",
}


def config_value(config: ExperimentConfig, dotted: str):
    """The value of a dotted key (``optim.lr``) in the config; ConfigError for an unknown key.
    Inside a mapping (``model.activation_kwargs.backend``) a key it does not hold is None: an
    option this config leaves out, which another (a run's checkpoint) may set."""
    value = config
    for part in dotted.split("."):
        if isinstance(value, dict):
            value = value.get(part)
            continue
        if not hasattr(value, part):
            raise ConfigError(f"{dotted!r} is not a configuration key")
        value = getattr(value, part)
    return value


def non_finite_settings(node: object, key: str = "") -> Iterator[tuple[str, float]]:
    """``(dotted key, value)`` of every float in ``node`` that is not a finite number, however
    deep: dataclass fields, list and tuple items (``data.sources[0].weight``, ``optim.betas[1]``)
    and mapping values (``model.activation_kwargs.alpha_p_init``).

    One rule for every float setting, because a range check cannot be trusted with them: every
    comparison with NaN is false, so ``x < 0`` lets it through, and infinity is above any
    bound. Both then reached the run (a NaN loss at step 1, a mixture source taking every token).
    """
    if isinstance(node, float):
        if not math.isfinite(node):
            yield key, node
    elif is_dataclass(node):
        for f in fields(node):
            yield from non_finite_settings(getattr(node, f.name), f"{key}.{f.name}".lstrip("."))
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            yield from non_finite_settings(item, f"{key}[{i}]")
    elif isinstance(node, dict):
        for name, item in node.items():
            yield from non_finite_settings(item, f"{key}.{name}")


def check_finite(config: ExperimentConfig) -> None:
    """Refuse the first float setting that is NaN or infinite, naming its key."""
    for key, value in non_finite_settings(config):
        raise ConfigError(f"{key} must be a finite number, got {value}")


def _must_be(key: str, rule: str, value: object) -> ConfigError:
    why = f" ({WHY[key]})" if key in WHY else ""
    return ConfigError(f"{key} must be {rule}{why}, got {value}")


def check_trainer(config: ExperimentConfig, world_size: int = 1) -> None:
    """The trainer's, optimizer's and logging's keys, alone and against each other; raises
    ConfigError naming the key. Changes nothing (``training.checks.check_config`` calls it)."""
    for key, allowed in CHOICES.items():
        if config_value(config, key) not in allowed:
            value = config_value(config, key)
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}")
    for key, minimum in BOUNDS.items():
        if config_value(config, key) < minimum:
            rule = "positive" if minimum == 1 else f">= {minimum}"
            raise _must_be(key, rule, config_value(config, key))
    for key in POSITIVE:
        if not config_value(config, key) > 0:
            raise _must_be(key, "positive", config_value(config, key))
    t, o = config.trainer, config.optim
    if t.global_batch_tokens is not None and (
        t.global_batch_tokens <= 0 or t.global_batch_tokens % config.data.seq_len
    ):
        raise ConfigError(
            f"trainer.global_batch_tokens={t.global_batch_tokens} is not a positive multiple "
            f"of data.seq_len={config.data.seq_len}"
        )
    per_step = t.micro_batch * world_size
    if config.sequences_per_step % per_step:
        given = (
            f"trainer.global_batch_tokens={t.global_batch_tokens} "
            f"({config.sequences_per_step} sequences)"
            if t.global_batch_tokens is not None
            else f"trainer.global_batch={t.global_batch}"
        )
        raise ConfigError(
            f"{given} is not divisible by trainer.micro_batch={t.micro_batch} x world size "
            f"{world_size}"
        )
    if not t.run_dir:
        raise ConfigError(
            "trainer.run_dir is empty: the run would write into, and resume from, the current "
            "directory; name one (the default is runs/${name}-${model.activation})"
        )
    if t.spike_window == 1:
        raise ConfigError(f"trainer.spike_window={t.spike_window} must be 0 (off) or >= 2")
    p = t.profile_steps
    if p and not (len(p) == 2 and 1 <= p[0] <= p[1] <= t.steps):
        raise ConfigError(
            f"trainer.profile_steps={list(p)} must be [first, last] with 1 <= first <= last <= "
            f"trainer.steps={t.steps}"
        )
    check_optimizer(o)
    if o.goldfish_k and o.goldfish_h >= config.data.seq_len:
        raise ConfigError(
            f"optim.goldfish_h={o.goldfish_h} is not below data.seq_len={config.data.seq_len}: "
            "no target of a window has that many ids before it, so Goldfish would leave out "
            "nothing"
        )
    if not 0 <= o.min_lr <= o.lr:
        raise ConfigError(f"optim.min_lr={o.min_lr} must lie in [0, optim.lr={o.lr}]")
    for name in ("axes", "allow_changes"):
        for key in getattr(t, name):
            try:
                config_value(config, key)
            except ConfigError as error:
                raise ConfigError(f"trainer.{name}: {error}") from None
    if config.data.seq_len > config.model.max_seq_len:
        raise ConfigError(
            f"data.seq_len={config.data.seq_len} exceeds model.max_seq_len="
            f"{config.model.max_seq_len}"
        )


# Goldfish's paper rule takes an int64 hash of the ids modulo k (training/loss_mask.py)
GOLDFISH_K_MAX = 2**63 - 1


def decayed_rates(o: OptimConfig) -> list[tuple[str, float]]:
    """(what names it, peak rate) of each parameter group weight decay applies to: decoupled
    decay multiplies those weights by 1 - rate x weight_decay every step (training/optim.py's
    groups; µP's hidden group divides the rate and multiplies the decay by the same factor)."""
    rates = [("optim.lr", o.lr)]
    if o.name == "muon":
        rates.append(("optim.muon_lr", o.muon_lr))
    if o.decay_activation_scalars:
        rates.append(("optim.lr x optim.scalar_lr_multiplier", o.lr * o.scalar_lr_multiplier))
    return rates


def check_optimizer(o: OptimConfig) -> None:
    """The optimizer's keys that a bound or a list of choices cannot say, refused by name."""
    for name, rate in decayed_rates(o):
        if rate * o.weight_decay >= 1:
            raise ConfigError(
                f"optim.weight_decay={o.weight_decay:g} x {name}={rate:g} = "
                f"{rate * o.weight_decay:g}: each step would multiply those weights by "
                f"{1 - rate * o.weight_decay:g}, zeroing or flipping them; the product must "
                "stay below 1 (0.1 x 1e-3 is usual)"
            )
    if o.goldfish_k > GOLDFISH_K_MAX:
        raise ConfigError(
            f"optim.goldfish_k={o.goldfish_k} is past 2**63 - 1: the ids' hash is an int64 "
            "taken modulo k (and 1/k of the targets is already none at far smaller k)"
        )
    if o.goldfish_k == 1:
        raise ConfigError(
            "optim.goldfish_k=1 would leave every target out of the loss: 0 turns Goldfish "
            "off, k >= 2 leaves out about 1/k"
        )
    if not all(0 <= beta < 1 for beta in o.betas) or len(o.betas) != 2:
        raise ConfigError(f"optim.betas={list(o.betas)} must be two values in [0, 1)")
    if o.name == "muon":
        if o.fused:
            raise ConfigError("optim.fused=true: Muon has no fused kernel")
        if not 0 <= o.muon_momentum < 1:
            raise ConfigError(f"optim.muon_momentum={o.muon_momentum} must lie in [0, 1)")
    if o.name != "ademamix":
        return
    if o.fused:
        raise ConfigError("optim.fused=true: AdEMAMix has no fused kernel (its foreach path runs)")
    if not 0 <= o.ademamix_beta3 < 1:
        raise ConfigError(f"optim.ademamix_beta3={o.ademamix_beta3} must lie in [0, 1)")


def _unknown_keys(node, schema_type, prefix: str = "") -> list[str]:
    """Keys present in the composed config but not in the schema (Hydra's ``+key=`` adds them
    even to a structured config)."""
    from dataclasses import fields, is_dataclass

    from omegaconf import DictConfig

    names = {f.name: f for f in fields(schema_type)}
    unknown = []
    for key in node:
        if key not in names:
            unknown.append(prefix + str(key))
            continue
        value = node[key]
        sub = getattr(schema_type(), key) if is_dataclass(schema_type) else None
        if isinstance(value, DictConfig) and is_dataclass(sub):
            unknown += _unknown_keys(value, type(sub), f"{prefix}{key}.")
    return unknown


def to_experiment(cfg) -> ExperimentConfig:
    """The composed Hydra config as the schema's dataclasses, with every check run."""
    from omegaconf import OmegaConf

    unknown = _unknown_keys(cfg, ExperimentConfig)
    if unknown:
        raise ValueError(
            f"unknown configuration keys: {', '.join(unknown)} (see training/config.py)"
        )
    experiment = OmegaConf.to_object(cfg)
    check_sources(experiment.data)
    return experiment


def register_configs() -> None:
    """Make the schema available to Hydra as ``experiment_schema``, and every registered
    activation as an option of the ``activation`` group (``activation=xiprelu_beta0``), so that
    adding an activation is one ``xielu.register(...)`` call and no YAML file."""
    from hydra.core.config_store import ConfigStore

    from xielu import available_activations

    store = ConfigStore.instance()
    # each entry once per process: a loop that composes configs calls this for each, and
    # converting the schema took 0.05 s of a 0.3 s compose; activations registered since are new
    if ("schema", "experiment_schema") not in _STORED:
        store.store(name="experiment_schema", node=ExperimentConfig)
        _STORED.add(("schema", "experiment_schema"))
    for name in available_activations():
        if ("activation", name) not in _STORED:
            node = {"activation": name, "activation_kwargs": {}}
            store.store(group="activation", name=name, node=node, package="model")
            _STORED.add(("activation", name))


_STORED: set[tuple[str, str]] = set()  # what register_configs has put in Hydra's ConfigStore
