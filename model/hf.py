"""Export to, and import from, Hugging Face transformers' own model classes.

An exported directory loads with ``AutoModelForCausalLM.from_pretrained`` and no remote code:

- gated MLP (SwiGLU, GeGLU, ReGLU)             -> ``LlamaForCausalLM``, ``hidden_act`` the gate's
- plain MLP without QK-norm (xIELU, ReLU², ...) -> ``ArceeForCausalLM``, MLP ``down(act(up(x)))``
- plain MLP with QK-norm                        -> ``ApertusForCausalLM``

The activation travels by name through transformers' ``ACT2FN``; each registered activation
states its name there (``xielu.ActivationSpec.hf``), and import maps it back with
``xielu.from_hf_name``. xIELU's ``alpha_p``, ``alpha_n``, ``beta`` and ``eps`` map one to one
onto ``mlp.act_fn.*``. Activations that transformers does not know (xIPReLU, xSiLU, ELU, the
ablations) are refused rather than shipped as custom modeling code: ``trust_remote_code`` is a
security and maintenance burden for whoever loads the model, and evaluation does not need it
(``eval/`` wraps the project's own model).

One transformers quirk: its ``XIELUActivation`` keeps its scalars in bf16 unless the model is
built with an explicit dtype (Apertus does, Arcee does not), so an xIELU model loaded as Arcee
rounds them to bf16, and ``.float()`` keeps the rounded values. The exported files hold the exact
fp32 values either way: ``import_hf`` restores them bit for bit, and ``to_hf_model`` builds a
transformers model that holds them (docs/huggingface.md, for lm-eval).

Both sides use the half-split RoPE layout, so q/k weights copy without permutation; the logits
agreement test in ``tests/test_hf_interop.py`` is what verifies it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import torch

from model.config import ModelConfig
from model.llama import Llama
from xielu import activation_spec, available_activations, from_hf_name

SIDECAR = "xielu_model_config.json"  # the exact ModelConfig, so import needs no guessing

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "arcee": "ArceeForCausalLM",
    "apertus": "ApertusForCausalLM",
}
# our block norm names -> Apertus's (Llama and Arcee use ours)
_APERTUS_NORMS = {
    "input_layernorm": "attention_layernorm",
    "post_attention_layernorm": "feedforward_layernorm",
}


class UnsupportedExportError(ValueError):
    """The model has no equivalent among transformers' built-in classes."""


def hf_activation_name(config: ModelConfig) -> str:
    """The ``ACT2FN`` name of the activation (for gated MLPs: of the gate)."""
    hf = activation_spec(config.activation).hf_name(**config.activation_kwargs)
    if hf is None:
        exportable = sorted(n for n in available_activations() if activation_spec(n).hf)
        raise UnsupportedExportError(
            f"activation {config.activation!r} (options {config.activation_kwargs or 'none'}) "
            f"has no counterpart in transformers' ACT2FN, so no built-in transformers class can "
            f"run it; exportable activations: {', '.join(exportable)}. Evaluate it with the "
            f"project's own model (eval/) instead."
        )
    return hf


def hf_model_type(config: ModelConfig) -> str:
    if config.gated:
        if config.qk_norm:
            raise UnsupportedExportError(
                "a gated MLP with QK-norm has no built-in transformers class (Llama has no "
                "QK-norm, Apertus has no gated MLP); export with model.qk_norm=false"
            )
        return "llama"
    return "apertus" if config.qk_norm else "arcee"


def to_hf_config(config: ModelConfig, bos_token_id: int | None = None, eos_token_id=None):
    """The transformers config equivalent to ``config``."""
    from transformers import AutoConfig

    model_type = hf_model_type(config)
    fields = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.dim,
        intermediate_size=config.hidden,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.kv_heads,
        hidden_act=hf_activation_name(config),
        max_position_embeddings=config.max_seq_len,
        initializer_range=config.effective_init_std,
        rms_norm_eps=config.norm_eps,
        # µP's logit multiplier is folded into the exported head, which then differs from the
        # embedding: transformers has no multiplier of its own
        tie_word_embeddings=config.tie_embeddings and config.width_multiplier == 1,
        rope_parameters=_rope_parameters(config),
        attention_bias=False,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=None,
        architectures=[_ARCHITECTURES[model_type]],
    )
    if model_type != "apertus":
        fields.update(head_dim=config.head_dim, mlp_bias=False)
    return AutoConfig.for_model(model_type, **fields)


def _rope_parameters(config: ModelConfig) -> dict:
    if config.rope_scaling_factor == 1:
        return {"rope_type": "default", "rope_theta": config.rope_theta}
    factor = config.rope_scaling_factor
    if config.rope_scaling == "llama3":
        return {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": config.rope_low_freq_factor,
            "high_freq_factor": config.rope_high_freq_factor,
            "original_max_position_embeddings": config.rope_original_max_seq_len,
            "rope_theta": config.rope_theta,
        }
    return {"rope_type": "linear", "factor": factor, "rope_theta": config.rope_theta}


def _rope_from_hf(hf: dict) -> dict:
    """``ModelConfig``'s RoPE keys from a config.json in transformers 5's layout
    (``rope_parameters``) or 4.x's (``rope_theta`` beside ``rope_scaling``, whose type key is
    ``type`` or ``rope_type``); a scaling other than linear and llama3 is refused, naming the
    key."""
    if hf.get("rope_parameters"):
        rope, key = hf["rope_parameters"], "rope_parameters"
        theta = rope.get("rope_theta", hf.get("rope_theta"))
    else:
        rope, key = hf.get("rope_scaling") or {}, "rope_scaling"
        theta = hf.get("rope_theta", 10000.0)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return {"rope_theta": float(theta)}
    if kind == "linear":
        return {"rope_theta": float(theta), "rope_scaling_factor": float(rope["factor"])}
    if kind == "llama3":
        needed = ("factor", "low_freq_factor", "high_freq_factor")
        missing = [
            name for name in (*needed, "original_max_position_embeddings") if name not in rope
        ]
        if missing:
            raise ValueError(f"config.json {key}: llama3 RoPE scaling without {', '.join(missing)}")
        return {
            "rope_theta": float(theta),
            "rope_scaling": "llama3",
            "rope_scaling_factor": float(rope["factor"]),
            "rope_low_freq_factor": float(rope["low_freq_factor"]),
            "rope_high_freq_factor": float(rope["high_freq_factor"]),
            "rope_original_max_seq_len": int(rope["original_max_position_embeddings"]),
        }
    raise ValueError(
        f"config.json {key}: RoPE scaling {kind!r} is not supported by model.Llama (plain "
        "RoPE, linear position interpolation and llama3 are)"
    )


def _hf_key(key: str, model_type: str) -> str:
    if key.startswith("lm_head."):
        return key
    if model_type == "apertus":
        for ours, theirs in _APERTUS_NORMS.items():
            key = key.replace(f".{ours}.", f".{theirs}.")
    return "model." + key


def _our_key(key: str, model_type: str) -> str:
    if key.startswith("lm_head."):
        return key
    key = key.removeprefix("model.")
    if model_type == "apertus":
        for ours, theirs in _APERTUS_NORMS.items():
            key = key.replace(f".{theirs}.", f".{ours}.")
    return key


def to_hf_model(model: Llama, **token_ids):
    """A transformers model holding ``model``'s weights (same dtype)."""
    from transformers import AutoModelForCausalLM

    config = model.config
    hf_config = to_hf_config(config, **token_ids)
    model_type = hf_config.model_type
    dtype = model.embed_tokens.weight.dtype
    # .to(): transformers builds XIELUActivation scalars in bf16 whatever the model dtype
    hf_model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype).to(dtype)
    state = {_hf_key(k, model_type): v for k, v in model.state_dict().items()}
    tied = hf_config.tie_word_embeddings
    if tied:
        state.pop("lm_head.weight")
    else:  # µP: logits x base / dim, as a head whose weight is scaled once
        state["lm_head.weight"] = state["lm_head.weight"] / config.width_multiplier
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(
            f"weight names do not line up with {type(hf_model).__name__}: "
            f"missing {missing}, unexpected {unexpected}"
        )
    if tied:
        hf_model.tie_weights()
    return hf_model.eval()


def holding_what_it_holds(model: Llama, hf_model) -> Llama:
    """A copy of ``model`` holding exactly the values the transformers model ``hf_model`` holds
    (that class's own rounding included, e.g. Arcee's bf16 xIELU scalars): against it, what is
    left of a logits difference is the two implementations' arithmetic, not the stored values."""
    model_type = hf_model.config.model_type
    copy = Llama(model.config).to(next(model.parameters()).dtype)
    ours = copy.state_dict()
    state = {}
    for key, value in hf_model.state_dict().items():
        mine = _our_key(key, model_type)
        if mine in ours:
            state[mine] = value.to(ours[mine].dtype)
    if "lm_head.weight" in state and not hf_model.config.tie_word_embeddings:
        state["lm_head.weight"] = state["lm_head.weight"] * model.config.width_multiplier
    copy.load_state_dict({**model.state_dict(), **state})
    return copy.eval()


def export_hf(
    model: Llama,
    out_dir: str | Path,
    dtype: torch.dtype | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> Path:
    """Write ``model`` as a transformers checkpoint directory (safetensors + config.json)."""
    out_dir = Path(out_dir)
    hf_model = to_hf_model(model, bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    if dtype is not None:
        hf_model = hf_model.to(dtype)
    hf_model.save_pretrained(out_dir)
    (out_dir / SIDECAR).write_text(json.dumps(asdict(model.config), indent=2) + "\n")
    return out_dir


def _config_from_hf(hf: dict) -> ModelConfig:
    """Rebuild a ModelConfig from a transformers config.json written by someone else.

    Activation options that only the weights hold are left at their defaults here;
    checkpoint_config reads them from the weights (``_options_in_state``).
    """
    model_type = hf.get("model_type")
    if model_type not in _ARCHITECTURES:
        raise ValueError(
            f"cannot import model_type {model_type!r}; supported: {', '.join(_ARCHITECTURES)}"
        )
    rope = _rope_from_hf(hf)
    act = hf["hidden_act"]
    found = from_hf_name(act, gated=model_type == "llama")
    if found is None:
        raise ValueError(f"hidden_act {act!r} of a {model_type} model has no project activation")
    activation, kwargs = found
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        dim=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        n_kv_heads=_kv_heads(hf),
        gated_hidden=hf["intermediate_size"],
        mlp_hidden=hf["intermediate_size"],
        activation=activation,
        activation_kwargs=kwargs,
        **rope,
        norm_eps=hf["rms_norm_eps"],
        tie_embeddings=hf.get("tie_word_embeddings", False),
        qk_norm=model_type == "apertus",
        max_seq_len=hf["max_position_embeddings"],
        init_std=hf.get("initializer_range", 0.02),
    )


def _kv_heads(hf: dict) -> int | None:
    """``num_key_value_heads``; None (multi-head, the default) when it equals the query heads."""
    heads = hf.get("num_key_value_heads", hf["num_attention_heads"])
    return None if heads == hf["num_attention_heads"] else heads


def _options_in_state(activation: str, hidden_act: str, state: dict) -> dict[str, float]:
    """The options of ``activation`` that transformers keeps as buffers rather than in its
    config (xIELU's ``beta`` and ``eps``, see ``HFName.state_options``) where they differ from
    the defaults, read from layer 0 (every layer is built with the same)."""
    spec = activation_spec(activation)
    defaults = spec.options()
    options = {}
    for hf in spec.hf:
        if hf.hidden_act != hidden_act:
            continue
        for name in hf.state_options:
            stored = state.get(f"layers.0.mlp.act_fn.{name}")
            if stored is not None and _shortest_float(stored) != defaults[name]:
                options[name] = _shortest_float(stored)
    return options


def _shortest_float(value: torch.Tensor) -> float:
    """The shortest decimal that rounds to ``value`` in its dtype: 0.3, not 0.30000001192092896
    (what the exporter's config most likely said, and exactly the same number in the model)."""
    for digits in range(1, 18):
        candidate = float(f"{float(value):.{digits}g}")
        if torch.tensor(candidate, dtype=value.dtype) == value:
            return candidate
    return float(value)


# The model settings a checkpoint's weights fix, or that say what the weights compute: a run
# that starts from the weights takes these from the checkpoint (``checkpoint_config``); the rest
# (attention kernel, initialisation, loss chunking, the vocabulary's padding rule, how long the
# RoPE tables are: ``max_seq_len``, the checkpoint's only by default) is how this project trains
# or builds, not what the weights are.
CHECKPOINT_KEYS = (
    "vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "gated_hidden", "mlp_hidden",
    "activation", "activation_kwargs", "rope_theta", "rope_scaling_factor", "rope_scaling",
    "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_seq_len", "norm_eps",
    "tie_embeddings", "qk_norm", "parametrization", "mup_base_dim",
)  # fmt: skip


def _hf_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} is not a transformers checkpoint: no config.json")
    return json.loads(config_file.read_text())


def _weight_files(path: Path) -> list[Path]:
    """The checkpoint's safetensors files: those its index names when it has one (a sharded
    checkpoint's ``model.safetensors.index.json``; other files beside it, a stale sharding or a
    consolidated copy, are not read), else every ``*.safetensors``."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise FileNotFoundError(f"{index.name} in {path} names files it lacks: {missing}")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    return files


def _weights(path: Path, model_type: str, wanted: set[str] | None = None):
    """``(our key, the file's key, tensor)`` for each tensor of the checkpoint (or only
    ``wanted``), one at a time: a rank loading an 8B checkpoint never holds a second copy of it.
    A tensor stored twice (two files name it) is refused: which copy is meant is unknowable."""
    from safetensors import safe_open

    seen: dict[str, str] = {}
    for file in _weight_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
                if key in seen:
                    raise ValueError(f"{key} is stored in both {seen[key]} and {file.name}")
                seen[key] = file.name
                ours = _our_key(key, model_type)
                if wanted is None or ours in wanted:
                    yield ours, key, handle.get_tensor(key)


def checkpoint_config(path: str | Path) -> ModelConfig:
    """The model a transformers checkpoint directory holds (ours or compatible): our sidecar's
    exact config when the export wrote one, else read from config.json and, for the activation
    options that only the weights hold (xIELU's ``beta`` and ``eps``), from layer 0's weights.
    ValueError for an architecture or activation ``model.Llama`` cannot hold."""
    path = Path(path)
    hf = _hf_config(path)
    sidecar = path / SIDECAR
    if sidecar.is_file():
        return ModelConfig(**json.loads(sidecar.read_text()))
    config = _config_from_hf(hf)
    wanted = {f"layers.0.mlp.act_fn.{name}" for h in activation_spec(config.activation).hf
              for name in h.state_options}  # fmt: skip
    state = {ours: tensor for ours, _, tensor in _weights(path, hf["model_type"], wanted)}
    stored = _options_in_state(config.activation, hf["hidden_act"], state)
    return replace(config, activation_kwargs={**config.activation_kwargs, **stored})


def load_hf_weights(model: Llama, path: str | Path) -> None:
    """Copy a checkpoint's weights into ``model``, built with ``checkpoint_config(path)``'s
    architecture, one tensor at a time, into the model's own dtype and device. Every tensor of
    the model must come from the checkpoint and every tensor of the checkpoint must have a
    place in the model, with the same shape: ValueError naming the file's tensor that does not
    (or the model's, up to five, that no file holds)."""
    path = Path(path)
    model_type = _hf_config(path)["model_type"]
    config = model.config
    targets = model.state_dict()
    loaded = set()
    with torch.no_grad():
        for key, stored, tensor in _weights(path, model_type):
            if key not in targets:
                raise ValueError(f"tensor {stored!r} has no place in the model")
            if tuple(tensor.shape) != tuple(targets[key].shape):
                raise ValueError(
                    f"tensor {stored!r} has shape {tuple(tensor.shape)}, the model's "
                    f"{tuple(targets[key].shape)}"
                )
            if key == "lm_head.weight":
                if config.tie_embeddings:  # the embedding (a µP export's head is scaled)
                    continue
                if config.width_multiplier != 1:  # µP: the export folded it in
                    tensor = tensor.to(targets[key].dtype) * config.width_multiplier
            targets[key].copy_(tensor)
            loaded.add(key)
    if config.tie_embeddings and "embed_tokens.weight" in loaded:
        loaded.add("lm_head.weight")  # the same tensor
    missing = sorted(set(targets) - loaded)
    if missing:
        raise ValueError(f"{path} holds no {', '.join(missing[:5])}{' ...' * (len(missing) > 5)}")


def import_hf(path: str | Path, dtype: torch.dtype = torch.float32) -> Llama:
    """The project's model from a transformers checkpoint directory (ours or compatible)."""
    model = Llama(checkpoint_config(path))
    load_hf_weights(model, path)
    return model.to(dtype)
