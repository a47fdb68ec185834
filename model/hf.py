"""Export to, and import from, Hugging Face transformers' own model classes.

An exported directory loads with ``AutoModelForCausalLM.from_pretrained`` and no remote code:

- gated MLP (SwiGLU, GeGLU, ReGLU)             -> ``LlamaForCausalLM``, ``hidden_act`` the gate's
- plain MLP without QK-norm (xIELU, ReLU², ...) -> ``ArceeForCausalLM``, MLP ``down(act(up(x)))``
- plain MLP with QK-norm                        -> ``ApertusForCausalLM``

The activation travels by name through transformers' ``ACT2FN``; xIELU's ``alpha_p``,
``alpha_n``, ``beta`` and ``eps`` map one to one onto ``mlp.act_fn.*``. Activations that
transformers does not know (xIPReLU, xSiLU, ELU, the ablations) are refused rather than shipped
as custom modeling code: ``trust_remote_code`` is a security and maintenance burden for whoever
loads the model, and evaluation does not need it (``eval/`` wraps the project's own model).

One transformers quirk: its ``XIELUActivation`` keeps its scalars in bf16 unless the model is
built with an explicit dtype (Apertus does, Arcee does not), so an xIELU model loaded as Arcee
computes softplus(alpha) in bf16 until ``.float()`` is called. The exported files hold the exact
fp32 values either way, and ``import_hf`` restores them bit for bit.

Both sides use the half-split RoPE layout, so q/k weights copy without permutation; the logits
agreement test in ``tests/test_hf_interop.py`` is what verifies it.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from model.config import ModelConfig
from model.llama import Llama

SIDECAR = "xielu_model_config.json"  # the exact ModelConfig, so import needs no guessing

# project activation (with its options) -> transformers ACT2FN name
_PLAIN_TO_HF = {"xielu": "xielu", "relu": "relu", "relu2": "relu2", "silu": "silu"}
_GATED_TO_HF = {"swiglu": "silu", "reglu": "relu"}
_GELU_TO_HF = {"none": "gelu", "tanh": "gelu_pytorch_tanh"}

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
    name, kwargs = config.activation, dict(config.activation_kwargs)
    if name in ("gelu", "geglu"):
        approximate = kwargs.pop("approximate", "none")
        hf = _GELU_TO_HF.get(approximate)
    elif name == "gelu_tanh":
        hf = "gelu_pytorch_tanh"
    else:
        hf = (_GATED_TO_HF if config.gated else _PLAIN_TO_HF).get(name)
    if name == "xielu":
        kwargs = {}  # its options (inits, beta, eps) travel in the state dict
    if hf is None or kwargs:
        exportable = sorted([*_PLAIN_TO_HF, *_GATED_TO_HF, "gelu", "gelu_tanh", "geglu"])
        raise UnsupportedExportError(
            f"activation {name!r} (options {kwargs or 'none'}) has no counterpart in "
            f"transformers' ACT2FN, so no built-in transformers class can run it; exportable "
            f"activations: {', '.join(exportable)}. Evaluate it with the project's own model "
            f"(eval/) instead."
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
        num_key_value_heads=config.n_heads,
        hidden_act=hf_activation_name(config),
        max_position_embeddings=config.max_seq_len,
        initializer_range=config.init_std,
        rms_norm_eps=config.norm_eps,
        tie_word_embeddings=config.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        attention_bias=False,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=None,
        architectures=[_ARCHITECTURES[model_type]],
    )
    if model_type != "apertus":
        fields.update(head_dim=config.head_dim, mlp_bias=False)
    return AutoConfig.for_model(model_type, **fields)


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
    if config.tie_embeddings:
        state.pop("lm_head.weight")
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (config.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(
            f"weight names do not line up with {type(hf_model).__name__}: "
            f"missing {missing}, unexpected {unexpected}"
        )
    if config.tie_embeddings:
        hf_model.tie_weights()
    return hf_model.eval()


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
    """Rebuild a ModelConfig from a transformers config.json written by someone else."""
    model_type = hf.get("model_type")
    if model_type not in _ARCHITECTURES:
        raise ValueError(
            f"cannot import model_type {model_type!r}; supported: {', '.join(_ARCHITECTURES)}"
        )
    rope = hf.get("rope_parameters") or {"rope_type": "default", "rope_theta": hf["rope_theta"]}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"RoPE scaling {rope['rope_type']!r} is not supported by model.Llama")
    if hf.get("num_key_value_heads", hf["num_attention_heads"]) != hf["num_attention_heads"]:
        raise ValueError("grouped-query attention is not supported by model.Llama")
    act = hf["hidden_act"]
    if model_type == "llama":
        by_hf = {v: k for k, v in _GATED_TO_HF.items()} | {"gelu": "geglu"}
        kwargs = {"approximate": "tanh"} if act == "gelu_pytorch_tanh" else {}
        activation = "geglu" if kwargs else by_hf.get(act)
    else:
        by_hf = {v: k for k, v in _PLAIN_TO_HF.items()} | {"gelu": "gelu"}
        kwargs = {}
        activation = "gelu_tanh" if act == "gelu_pytorch_tanh" else by_hf.get(act)
    if activation is None:
        raise ValueError(f"hidden_act {act!r} of a {model_type} model has no project activation")
    return ModelConfig(
        vocab_size=hf["vocab_size"],
        dim=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        gated_hidden=hf["intermediate_size"],
        mlp_hidden=hf["intermediate_size"],
        activation=activation,
        activation_kwargs=kwargs,
        rope_theta=float(rope["rope_theta"]),
        norm_eps=hf["rms_norm_eps"],
        tie_embeddings=hf.get("tie_word_embeddings", False),
        qk_norm=model_type == "apertus",
        max_seq_len=hf["max_position_embeddings"],
        init_std=hf.get("initializer_range", 0.02),
    )


def import_hf(path: str | Path, dtype: torch.dtype = torch.float32) -> Llama:
    """The project's model from a transformers checkpoint directory (ours or compatible)."""
    from safetensors.torch import load_file

    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} is not a transformers checkpoint: no config.json")
    hf = json.loads(config_file.read_text())
    sidecar = path / SIDECAR
    config = ModelConfig(**json.loads(sidecar.read_text())) if sidecar.is_file() else None
    config = config or _config_from_hf(hf)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    state = {}
    for file in files:
        state.update({_our_key(k, hf["model_type"]): v for k, v in load_file(file).items()})
    if config.tie_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model = Llama(config)
    model.load_state_dict(state, strict=True)
    return model.to(dtype)
