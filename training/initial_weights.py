"""A run's start from published weights: ``checkpoint.initial_hf``, a transformers checkpoint
directory (this project's export, a Llama, an Apertus) whose weights a fresh run starts from,
with a fresh optimizer (continued pretraining, as torchtitan's ``initial_load_in_hf``).

Each part refuses before anything is written:

- composing (:func:`take_architecture`, called by ``training.config.to_experiment``): the model
  settings the weights fix (``model.hf.CHECKPOINT_KEYS``) are the checkpoint's. A key that says
  so (``${initial_hf:KEY}``: ``model=from_checkpoint`` and ``activation=from_checkpoint`` say it
  of every one) or is left to be derived (``None``: the vocabulary, the key/value heads) is
  filled from it; a key set to another value is refused, naming it and both values, so that a
  command line never trains a model other than the one it names. ``data.tokenizer.name=hf``
  without a path takes the checkpoint's own tokenizer.
- starting (:func:`check_tokenizer`, :func:`load_initial_weights`, from the trainer): a
  tokenizer other than the checkpoint's own must have its vocabulary; on a fresh start the
  weights are copied into the bare model on every rank before it is wrapped (DDP, FSDP2), so
  every rank holds them before the first step. A run directory with a checkpoint of its own
  resumes from that and says so: the published weights are its step 0, not its present.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from model import Llama, ModelConfig
from model.hf import CHECKPOINT_KEYS, checkpoint_config, load_hf_weights
from settings import ConfigError
from training.checkpoint.layout import complete_checkpoints

log = logging.getLogger(__name__)

# the keys whose None means "derive it" (from the tokenizer, from n_heads, from gated_hidden),
# or "not used" (µP's base under the standard parametrization): the checkpoint's value is taken
DERIVED_WHEN_NONE = ("vocab_size", "n_kv_heads", "mlp_hidden", "mup_base_dim")
# what model=from_checkpoint fills: the keys the weights fix, and the RoPE tables' length, the
# checkpoint's by default and the run's to choose (a longer context than it was trained at)
FILLED_KEYS = (*CHECKPOINT_KEYS, "max_seq_len")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


RESOLVER = "initial_hf"
FROM_CHECKPOINT = "from_checkpoint"  # the model's and the activation's option that says so
_UNSET = (
    "model.{key} is to be read from checkpoint.initial_hf, which is not set: "
    "model=from_checkpoint and activation=from_checkpoint take the architecture from a "
    "transformers checkpoint directory named there"
)


def from_checkpoint(key: str) -> str:
    """The value of a model key that says "the checkpoint's" (``model=from_checkpoint``)."""
    return f"${{{RESOLVER}:{key}}}"


@functools.cache
def _checkpoint_config(path: str):
    return checkpoint_config(path)


def register_resolver() -> None:
    """``${initial_hf:dim}`` resolves to the checkpoint's value wherever something resolves it
    before :func:`take_architecture` has filled it (Hydra's multirun directory names
    ``${model.activation}``)."""

    def resolve(key: str, _root_):
        path = _root_.checkpoint.initial_hf
        if path is None:
            raise ConfigError(_UNSET.format(key=key))
        value = getattr(_checkpoint_config(str(path)), key)
        return dict(value) if isinstance(value, dict) else value

    OmegaConf.register_new_resolver(RESOLVER, resolve, replace=True, use_cache=False)


def _checkpoint_or_refuse(path: str):
    try:
        return _checkpoint_config(str(path))
    except (OSError, ValueError, KeyError, TypeError) as error:  # KeyError: a key config.json
        reason = f"lacks {error}" if isinstance(error, KeyError) else str(error)  # lacks
        raise ConfigError(
            f"checkpoint.initial_hf={path}: {reason} (a run resuming from its own checkpoint "
            "reads its architecture here too: the directory must stay where it was)"
        ) from None


def _compared(key: str, theirs: ModelConfig) -> bool:
    """Whether a key set on both sides must agree: not where the checkpoint's model does not
    use it (the gated width beside an explicit MLP width, llama3's numbers without llama3
    scaling, the scaling's kind at factor 1, µP's base under the standard parametrization)."""
    if key == "gated_hidden":
        return theirs.mlp_hidden is None
    if key in ("rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_seq_len"):
        return theirs.rope_scaling == "llama3" and theirs.rope_scaling_factor != 1
    if key == "rope_scaling":
        return theirs.rope_scaling_factor != 1
    if key == "mup_base_dim":
        return theirs.parametrization == "mup"
    return True


def _effective(key: str, value, model: DictConfig):
    """``n_kv_heads``' None is ``n_heads``: the same model as the number written out."""
    if key == "n_kv_heads" and value is None:
        return model.n_heads
    return OmegaConf.to_container(value) if isinstance(value, DictConfig) else value


def take_architecture(cfg: DictConfig) -> None:
    """Fill ``cfg``'s model keys from ``checkpoint.initial_hf`` in place (the composed config,
    before it becomes the dataclasses), or refuse the keys that disagree with it."""
    path = cfg.checkpoint.initial_hf
    raw = OmegaConf.to_container(cfg.model, resolve=False)
    unset = [key for key in FILLED_KEYS if raw.get(key) == from_checkpoint(key)]
    if path is None:
        if unset:
            raise ConfigError(_UNSET.format(key=unset[0]))
        return
    theirs = _checkpoint_or_refuse(path)
    conflicts = []
    for key in FILLED_KEYS:
        value = getattr(theirs, key)
        if key in unset or (key in DERIVED_WHEN_NONE and cfg.model[key] is None):
            cfg.model[key] = value
            continue
        if key not in CHECKPOINT_KEYS or not _compared(key, theirs):
            continue
        ours, same = _effective(key, cfg.model[key], cfg.model), _effective(key, value, cfg.model)
        if ours != same:
            conflicts.append(f"model.{key}={ours} (the checkpoint's: {same})")
    if conflicts:
        raise ConfigError(
            f"checkpoint.initial_hf={path} holds another model than these settings: "
            f"{'; '.join(conflicts)}. model=from_checkpoint and activation=from_checkpoint "
            "take each from the checkpoint (experiment=continued does both)"
        )
    tokenizer = cfg.data.tokenizer
    if tokenizer.name == "hf" and tokenizer.path is None:
        if not holds_tokenizer(path):
            raise ConfigError(
                f"data.tokenizer.name=hf takes checkpoint.initial_hf's tokenizer, and {path} "
                f"holds none ({' or '.join(TOKENIZER_FILES)}): set data.tokenizer.path"
            )
        tokenizer.path = str(path)


def holds_tokenizer(path: str | Path) -> bool:
    return any((Path(path) / name).is_file() for name in TOKENIZER_FILES)


def check_tokenizer(initial_hf: str | None, tokenizer_path: str | None, vocab: int) -> None:
    """A checkpoint that ships its tokenizer was trained on its ids: a run that reads the text
    with another tokenizer of a different vocabulary would train on ids meaning other tokens."""
    if initial_hf is None or not holds_tokenizer(initial_hf):
        return
    if tokenizer_path is not None and Path(tokenizer_path) == Path(initial_hf):
        return
    from data.tokenizers import TOKENIZERS

    theirs = TOKENIZERS["hf"].load(initial_hf).vocab_size
    if theirs != vocab:
        raise ConfigError(
            f"checkpoint.initial_hf={initial_hf} was trained with its own tokenizer ({theirs} "
            f"ids), and data.tokenizer reads the text into {vocab}: train with "
            "data.tokenizer.name=hf (the checkpoint's), or a tokenizer of the same vocabulary"
        )


def load_initial_weights(model: Llama, initial_hf: str | None, run_dir: Path, main: bool) -> bool:
    """Copy ``initial_hf``'s weights into the bare ``model`` on a fresh start; True when it did.
    A run directory with a published checkpoint resumes from it instead."""
    if initial_hf is None:
        return False
    if complete_checkpoints(run_dir):
        if main:
            log.info(
                "checkpoint.initial_hf=%s not read: the run resumes from its own checkpoint",
                initial_hf,
            )
        return False
    try:
        load_hf_weights(model, initial_hf)
    except (OSError, ValueError) as error:
        raise ConfigError(f"checkpoint.initial_hf={initial_hf}: {error}") from None
    if main:
        log.info("initial weights: %s (fresh optimizer state)", initial_hf)
    return True
