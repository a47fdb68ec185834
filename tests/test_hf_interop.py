"""Hugging Face export/import against transformers' own Llama, Arcee and Apertus classes."""

import json

import pytest
import torch

from model import Llama, ModelConfig
from model.hf import SIDECAR, UnsupportedExportError, export_hf, import_hf
from xielu import activation_spec, available_activations

transformers = pytest.importorskip("transformers")

VOCAB = 256


def random_model(activation: str, **overrides) -> Llama:
    """A small model whose every weight (alphas included) is away from its initial value."""
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=VOCAB,
        dim=64,
        n_layers=2,
        n_heads=4,
        gated_hidden=96,
        max_seq_len=128,
        activation=activation,
        **overrides,
    )
    model = Llama(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def load_hf(path):
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    # transformers builds Arcee's XIELUActivation scalars in bf16 whatever dtype is asked for
    return hf.float().eval()


def round_activation_scalars_to_bf16(model: Llama) -> None:
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if ".act_fn." in name:
                t.copy_(t.bfloat16().float())


LLAMA3_ROPE = {
    "rope_scaling": "llama3",
    "rope_scaling_factor": 8.0,
    "rope_theta": 10000.0,
    "rope_original_max_seq_len": 32,
}
EXPORTABLE = [
    ("swiglu", {}, "LlamaForCausalLM"),
    ("geglu", {}, "LlamaForCausalLM"),
    ("geglu", {"activation_kwargs": {"approximate": "tanh"}}, "LlamaForCausalLM"),
    ("reglu", {}, "LlamaForCausalLM"),
    ("xielu", {}, "ArceeForCausalLM"),
    ("relu2", {}, "ArceeForCausalLM"),
    ("relu", {}, "ArceeForCausalLM"),
    ("gelu", {}, "ArceeForCausalLM"),
    ("gelu_tanh", {}, "ArceeForCausalLM"),
    ("silu", {"tie_embeddings": False}, "ArceeForCausalLM"),
    # grouped-query attention and Llama 3.1's RoPE scaling (its original context below the
    # sequence, so that every kind of frequency, stretched, kept and blended, is exercised)
    ("swiglu", {"n_kv_heads": 2, **LLAMA3_ROPE}, "LlamaForCausalLM"),
    ("xielu", {"qk_norm": True, "n_kv_heads": 1, **LLAMA3_ROPE}, "ApertusForCausalLM"),
    ("xielu", {"qk_norm": True}, "ApertusForCausalLM"),
    ("relu2", {"qk_norm": True, "tie_embeddings": False}, "ApertusForCausalLM"),
]


@pytest.mark.parametrize("activation,overrides,hf_class", EXPORTABLE)
def test_exported_model_gives_the_same_logits_in_transformers(
    tmp_path, activation, overrides, hf_class
):
    model = random_model(activation, **overrides)
    export_hf(model, tmp_path)
    hf = load_hf(tmp_path)
    assert type(hf).__name__ == hf_class
    if activation == "xielu" and not model.config.qk_norm:
        round_activation_scalars_to_bf16(model)  # what transformers' Arcee stored, see load_hf
    # 100 positions: a wrong RoPE layout (interleaved vs half-split) would show at once
    tokens = torch.randint(0, VOCAB, (2, 100))
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model(tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation,overrides,hf_class", EXPORTABLE[:5:2] + EXPORTABLE[-4:])
def test_import_restores_the_model_bit_for_bit(tmp_path, activation, overrides, hf_class):
    model = random_model(activation, **overrides)
    export_hf(model, tmp_path)
    back = import_hf(tmp_path)
    assert back.config == model.config
    theirs = back.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(theirs[name], tensor), name
    assert back.config.tie_embeddings == (back.lm_head.weight is back.embed_tokens.weight)


@pytest.mark.parametrize("activation,overrides,hf_class", EXPORTABLE[:1] + EXPORTABLE[4:6])
def test_import_without_our_sidecar_reads_the_transformers_config(
    tmp_path, activation, overrides, hf_class
):
    model = random_model(activation, **overrides)
    export_hf(model, tmp_path)
    (tmp_path / SIDECAR).unlink()
    back = import_hf(tmp_path).eval()
    assert back.config.activation == activation and back.config.hidden == model.config.hidden
    tokens = torch.randint(0, VOCAB, (1, 40))
    with torch.no_grad():
        torch.testing.assert_close(back(tokens), model(tokens), rtol=0, atol=0)


def test_import_without_our_sidecar_reads_xielus_beta_and_eps_from_the_weights(tmp_path):
    """transformers' config has no field for them; mlp.act_fn.beta / eps in the file hold them."""
    options = {"beta": 0.3, "eps": -1e-5}
    model = random_model("xielu", activation_kwargs=options)
    export_hf(model, tmp_path)
    (tmp_path / SIDECAR).unlink()
    back = import_hf(tmp_path).eval()
    assert back.config.activation == "xielu" and back.config.activation_kwargs == options
    tokens = torch.randint(0, VOCAB, (1, 40))
    with torch.no_grad():
        torch.testing.assert_close(back(tokens), model(tokens), rtol=0, atol=0)


def test_import_without_our_sidecar_leaves_default_options_unset(tmp_path):
    export_hf(random_model("xielu"), tmp_path)
    (tmp_path / SIDECAR).unlink()
    assert import_hf(tmp_path).config.activation_kwargs == {}


@pytest.mark.parametrize("name", available_activations())
def test_every_declared_hf_name_is_an_activation_transformers_has(name):
    from transformers.activations import ACT2FN

    for hf in activation_spec(name).hf:
        assert hf.hidden_act in ACT2FN, (name, hf)


@pytest.mark.parametrize("activation", ["xiprelu", "xsilu", "elu", "xielu_neg_zero", "xielu_beta1"])
def test_activations_unknown_to_transformers_are_refused(tmp_path, activation):
    with pytest.raises(UnsupportedExportError, match=rf"'{activation}'.*exportable activations"):
        export_hf(random_model(activation), tmp_path)
    assert not any(tmp_path.iterdir()), "a refused export must not leave partial files"


def test_gated_mlp_with_qk_norm_is_refused(tmp_path):
    with pytest.raises(UnsupportedExportError, match="qk_norm"):
        export_hf(random_model("swiglu", qk_norm=True), tmp_path)


def test_a_transformers_4_config_with_linear_rope_scaling_imports_with_transformers_logits(
    tmp_path,
):
    """4.x wrote ``rope_theta`` beside ``rope_scaling: {"type": "linear", "factor": f}``;
    read as plain RoPE, every position past 0 would be rotated by the wrong angle."""
    model = random_model("swiglu", rope_theta=10000.0, rope_scaling_factor=2.0)
    export_hf(model, tmp_path)
    (tmp_path / SIDECAR).unlink()
    config_file = tmp_path / "config.json"
    config = json.loads(config_file.read_text())
    assert config["rope_parameters"]["rope_type"] == "linear"  # as transformers 5 writes it
    del config["rope_parameters"]
    config |= {"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    config_file.write_text(json.dumps(config))
    back = import_hf(tmp_path).eval()
    assert (back.config.rope_theta, back.config.rope_scaling_factor) == (10000.0, 2.0)
    hf = load_hf(tmp_path)
    tokens = torch.randint(0, VOCAB, (2, 100))
    plain = random_model("swiglu", rope_theta=10000.0)
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, back(tokens), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(back(tokens), model(tokens), rtol=0, atol=0)
        assert not torch.allclose(plain(tokens), model(tokens), atol=1e-3)  # it matters
    for legacy in ({"type": "dynamic", "factor": 2.0}, {"rope_type": "yarn", "factor": 4.0}):
        config["rope_scaling"] = legacy
        config_file.write_text(json.dumps(config))
        with pytest.raises(
            ValueError, match=r"config\.json rope_scaling: RoPE scaling '(dynamic|yarn)'"
        ):
            import_hf(tmp_path)


def test_import_refuses_a_rope_scaling_it_does_not_have_and_an_incomplete_llama3(tmp_path):
    export_hf(random_model("relu2"), tmp_path)
    (tmp_path / SIDECAR).unlink()
    config_file = tmp_path / "config.json"
    config = json.loads(config_file.read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0}
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"yarn.*llama3 are"):
        import_hf(tmp_path)
    config["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="without low_freq_factor, high_freq_factor, original"):
        import_hf(tmp_path)


# µP (model.parametrization=mup): the logit multiplier base / dim is folded into the exported
# head; a tied model is exported untied. Widths 4x and 2x the base: exact powers of two, so
# the fold and its inverse on import are exact.
MUP = [
    ("swiglu", {"parametrization": "mup", "mup_base_dim": 16}, "LlamaForCausalLM"),
    (
        "relu2",
        {"parametrization": "mup", "mup_base_dim": 32, "tie_embeddings": False},
        "ArceeForCausalLM",
    ),
]


@pytest.mark.parametrize("activation,overrides,hf_class", MUP)
def test_a_mup_model_exports_with_its_logit_multiplier_folded_in(
    tmp_path, activation, overrides, hf_class
):
    model = random_model(activation, **overrides)
    assert model.config.width_multiplier in (2.0, 4.0)
    export_hf(model, tmp_path)
    hf = load_hf(tmp_path)
    assert type(hf).__name__ == hf_class and not hf.config.tie_word_embeddings
    tokens = torch.randint(0, VOCAB, (2, 50))
    with torch.no_grad():
        ours = model(tokens)
        torch.testing.assert_close(hf(tokens).logits, ours, rtol=1e-5, atol=1e-5)
        # the multiplier is applied: the bare head would give logits m times larger
        unscaled = model.lm_head(model.norm(model.embed_tokens(tokens)))
        assert not torch.allclose(ours, unscaled)
    back = import_hf(tmp_path)
    assert back.config == model.config
    for name, tensor in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
