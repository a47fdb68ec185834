"""The run's configuration: one section per part of the program, assembled here.

Each section is a dataclass defined beside the part that reads it, which checks its own keys
(``settings.Section``): ``model`` (model/config.py), ``data`` (data/config.py), ``optim``
(training/optim.py, with ``optim.ademamix`` and ``optim.muon`` in their optimizers' modules),
``loss`` (training/loss_mask.py), ``schedule`` (training/schedule.py), ``parallel``
(training/runtime/parallelize.py), ``checkpoint`` (training/checkpoint/layout.py),
``validation`` and ``downstream`` (training/instruments/measurements.py), ``spikes``
(training/step_health.py), ``profile`` (training/instruments/profiling.py), ``logging``
(training/instruments/metrics.py), and here ``trainer``: the run itself (its length, batch, seed
and directory). Hydra YAML files only set values; an unknown key or a wrong type fails at
composition, a value that can never work when its section is built, and a value that cannot
work with another section's when the run starts (``training.checks.check_config``). A key
renamed since older runs is refused naming its new place (``training.renamed_keys``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass

from data.config import DataConfig
from data.sources import check_sources
from model.config import ModelConfig
from settings import ConfigError, Run, Section, at_least, check_finite
from training.batch_ramp import RampStage, check_batch_ramp
from training.checkpoint.layout import CheckpointConfig
from training.instruments.measurements import DownstreamConfig, ValidationConfig
from training.instruments.metrics import LoggingConfig
from training.instruments.profiling import ProfileConfig
from training.loss_mask import LossConfig
from training.optim import OptimConfig
from training.renamed_keys import renamed_key_message
from training.runtime.parallelize import ParallelConfig
from training.schedule import ScheduleConfig
from training.step_health import SpikesConfig

# what makes two runs different experiments rather than one run resumed (``training/axes.py``)
DEFAULT_AXES = (
    "model.activation",
    "model.init_scaling",
    "model.parametrization",
    "model.mup_base_dim",
    "optim.name",
    "optim.lr",
    "optim.scalar_lr_multiplier",
    "trainer.seed",
    "data.seed",
)


@dataclass
class TrainerConfig(Section):
    """``trainer``: the run itself.

    Attributes:
        steps: optimizer steps in the run.
        global_batch: sequences per optimizer step over all ranks (paper: 440 at 1.1B, 640 at
            3B, 80 in the ablations); gradient accumulation = global / (micro_batch x world).
        global_batch_tokens: the global batch in tokens instead (e.g. 1_802_240 = 440 x 4096);
            a multiple of ``data.seq_len``; when set it replaces ``global_batch``.
        micro_batch: sequences per rank per forward/backward.
        batch_ramp: the global batch grows (or changes) during the run: ``[{tokens: T,
            global_batch: B}, ...]``, token counts increasing; before the first ``T`` the batch
            is ``global_batch`` (or ``global_batch_tokens``). With a ramp the learning-rate
            schedule follows the tokens consumed, not the steps (``training/batch_ramp.py``).
            Empty: one batch for the whole run.
        seed: model initialisation and everything else random.
        run_dir: where checkpoints, metrics.jsonl and the resolved config go.
        axes: the keys that say which run a run directory holds: written to ``axes.json`` in
            it, and a resume may not change them (``training/resume_rules.py``);
            ``scripts.sweep`` adds the keys it varies.
        allow_changes: keys that a resume may not change (``training/resume_rules.py``: the
            model's, the data's, the axes) that this start changes on purpose, e.g.
            ``[data.paths]`` after moving the files; empty: every such change is refused.
        log_every: steps between console / metrics lines.
    """

    steps: int = 100
    global_batch: int = 8
    global_batch_tokens: int | None = None
    micro_batch: int = 8
    batch_ramp: list[RampStage] = field(default_factory=list)
    seed: int = 0
    # deterministic, so that rerunning the same command (a requeued SLURM job) resumes
    run_dir: str = "runs/${name}-${model.activation}"
    axes: list[str] = field(default_factory=lambda: list(DEFAULT_AXES))
    allow_changes: list[str] = field(default_factory=list)
    log_every: int = 10

    def check(self, run: Run | None = None) -> None:
        for key in ("steps", "global_batch", "micro_batch", "log_every"):
            at_least(f"trainer.{key}", getattr(self, key), 1)
        if not self.run_dir:
            raise ConfigError(
                "trainer.run_dir is empty: the run would write into, and resume from, the "
                "current directory; name one (the default is runs/${name}-${model.activation})"
            )
        if run is None:
            return
        config, world_size = run.config, run.world_size
        seq_len = config.data.seq_len
        if self.global_batch_tokens is not None and (
            self.global_batch_tokens <= 0 or self.global_batch_tokens % seq_len
        ):
            raise ConfigError(
                f"trainer.global_batch_tokens={self.global_batch_tokens} is not a positive "
                f"multiple of data.seq_len={seq_len}"
            )
        if config.sequences_per_step % (self.micro_batch * world_size):
            given = (
                f"trainer.global_batch_tokens={self.global_batch_tokens} "
                f"({config.sequences_per_step} sequences)"
                if self.global_batch_tokens is not None
                else f"trainer.global_batch={self.global_batch}"
            )
            raise ConfigError(
                f"{given} is not divisible by trainer.micro_batch={self.micro_batch} x world "
                f"size {world_size}"
            )
        check_batch_ramp(config, world_size)
        for name in ("axes", "allow_changes"):
            for key in getattr(self, name):
                try:
                    config_value(config, key)
                except ConfigError as error:
                    raise ConfigError(f"trainer.{name}: {error}") from None


@dataclass
class ExperimentConfig:
    """The whole run: what ``train.py`` composes from ``configs/``, a section per part."""

    name: str = "run"
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    downstream: DownstreamConfig = field(default_factory=DownstreamConfig)
    spikes: SpikesConfig = field(default_factory=SpikesConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
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


def config_value(config: ExperimentConfig, dotted: str):
    """The value of a dotted key (``optim.lr``) in the config; ConfigError for an unknown key
    (naming its new place when it was renamed). Inside a mapping
    (``model.activation_kwargs.backend``) a key it does not hold is None: an option this config
    leaves out, which another (a run's checkpoint) may set."""
    value = config
    for part in dotted.split("."):
        if isinstance(value, dict):
            value = value.get(part)
            continue
        if not hasattr(value, part):
            raise ConfigError(
                renamed_key_message(dotted) or f"{dotted!r} is not a configuration key"
            )
        value = getattr(value, part)
    return value


def _unknown_keys(node, schema_type, prefix: str = "") -> list[str]:
    """Keys present in the composed config but not in the schema (Hydra's ``+key=`` adds them
    even to a structured config)."""
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


def to_experiment(cfg, initial_weights: bool = True) -> ExperimentConfig:
    """The composed Hydra config as the schema's dataclasses, each section checked alone.
    ``initial_weights``: fill (or check) the model keys from ``checkpoint.initial_hf`` first
    (``training.initial_weights.take_architecture``; ``cfg`` holds them afterwards); a run
    directory's saved config holds them already, and is read without the checkpoint."""
    from omegaconf import OmegaConf

    from training.initial_weights import take_architecture

    if initial_weights:  # first: reading any key that names the run resolves those it names
        take_architecture(cfg)
    unknown = _unknown_keys(cfg, ExperimentConfig)
    for key in unknown:
        if renamed_key_message(key):
            raise ConfigError(renamed_key_message(key))
    if unknown:
        raise ConfigError(
            f"unknown configuration keys: {', '.join(unknown)} (see training/config.py)"
        )
    # before the sections are built: each checks its ranges then, and a comparison with NaN
    # is false, so only this rule names a NaN or an infinity for what it is
    check_finite(OmegaConf.to_container(cfg, resolve=True))
    experiment = OmegaConf.to_object(cfg)
    check_sources(experiment.data)
    return experiment


def register_configs() -> None:
    """Make the schema available to Hydra as ``experiment_schema``, and every registered
    activation as an option of the ``activation`` group (``activation=xiprelu_beta0``), so that
    adding an activation is one ``xielu.register(...)`` call and no YAML file; and the options
    that take both from a published checkpoint (``from_checkpoint``)."""
    from hydra.core.config_store import ConfigStore

    from training.initial_weights import (
        FILLED_KEYS,
        FROM_CHECKPOINT,
        from_checkpoint,
        register_resolver,
    )
    from xielu import available_activations

    register_resolver()
    store = ConfigStore.instance()
    # each entry once per process: a loop that composes configs calls this for each, and
    # converting the schema took 0.05 s of a 0.3 s compose; activations registered since are new
    if ("schema", "experiment_schema") not in _STORED:
        store.store(name="experiment_schema", node=ExperimentConfig)
        _STORED.add(("schema", "experiment_schema"))
    # model=from_checkpoint and activation=from_checkpoint: the architecture and activation of
    # checkpoint.initial_hf, every key saying so, filled when the config is built
    # (training/initial_weights.py); the activation group comes after the model's
    activation_keys = ("activation", "activation_kwargs")
    options = [
        ("activation", name, {"activation": name, "activation_kwargs": {}})
        for name in available_activations()
    ]
    activation = {k: from_checkpoint(k) for k in activation_keys}
    model = {k: from_checkpoint(k) for k in FILLED_KEYS if k not in activation_keys}
    options += [("activation", FROM_CHECKPOINT, activation), ("model", FROM_CHECKPOINT, model)]
    for group, name, node in options:
        if (group, name) not in _STORED:
            store.store(group=group, name=name, node=node, package="model")
            _STORED.add((group, name))


_STORED: set[tuple[str, str]] = set()  # what register_configs has put in Hydra's ConfigStore
