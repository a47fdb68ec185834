"""The Llama model: matched sizes, parameter and FLOP counts, causality, RoPE, per-layer alphas."""

import pytest
import torch

from model import Llama, ModelConfig, count_parameters, pad_vocab, training_flops_per_token
from model.layers import apply_rope, rope_tables

PAPER_1B = dict(vocab_size=147456, dim=1536, n_layers=24, n_heads=16, gated_hidden=6144)
PAPER_3B = dict(
    vocab_size=147456, dim=2048, n_layers=36, n_heads=16, gated_hidden=8192, tie_embeddings=False
)


def tiny(**overrides) -> ModelConfig:
    base = dict(vocab_size=96, dim=32, n_layers=3, n_heads=4, gated_hidden=64, max_seq_len=64)
    return ModelConfig(**{**base, **overrides})


@pytest.mark.parametrize("preset,label,hidden", [(PAPER_1B, 1.1, 9216), (PAPER_3B, 3.0, 12288)])
def test_paper_swiglu_and_xielu_models_match_in_size_and_flops(preset, label, hidden):
    swiglu = ModelConfig(**preset, activation="swiglu")
    xielu = ModelConfig(**preset, activation="xielu")
    assert xielu.hidden == hidden and swiglu.hidden == preset["gated_hidden"]
    a, b = count_parameters(swiglu), count_parameters(xielu)
    assert b.activation_scalars == 2 * preset["n_layers"] and a.activation_scalars == 0
    assert a.total == b.total - b.activation_scalars
    assert round(a.total / 1e9, 1) == label
    assert training_flops_per_token(swiglu, 4096) == training_flops_per_token(xielu, 4096)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"activation": "swiglu"},
        {"tie_embeddings": False},
        {"qk_norm": True},
        {"activation": "relu2", "mlp_hidden": 40},
        {"n_kv_heads": 2, "qk_norm": True},
        {"n_kv_heads": 2, "parametrization": "mup", "mup_base_dim": 16},
    ],
)
def test_parameter_count_matches_the_built_model(overrides):
    config = tiny(**overrides)
    model = Llama(config)
    assert count_parameters(config).total == sum(p.numel() for p in model.parameters())


def test_tied_embeddings_share_one_matrix():
    model = Llama(tiny())
    assert model.lm_head.weight is model.embed_tokens.weight
    untied = Llama(tiny(tie_embeddings=False))
    assert untied.lm_head.weight is not untied.embed_tokens.weight
    tied_count = sum(p.numel() for p in model.parameters())
    untied_count = sum(p.numel() for p in untied.parameters())
    assert untied_count == tied_count + untied.lm_head.weight.numel()
    with torch.no_grad():  # one matrix: a change through the embedding shows in the head
        model.embed_tokens.weight[3, 0] += 1.0
    assert model.lm_head.weight[3, 0] == model.embed_tokens.weight[3, 0]


def test_flops_per_token_follow_the_palm_formula():
    config = tiny(tie_embeddings=False)
    p = count_parameters(config)
    expected = 6 * (p.lm_head + p.attention + p.mlp) + 12 * 3 * 32 * 50
    assert training_flops_per_token(config, 50) == expected


def test_logits_at_a_position_ignore_later_tokens():
    torch.manual_seed(0)
    model = Llama(tiny()).eval()
    tokens = torch.randint(0, 96, (2, 20))
    changed = tokens.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % 96
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12])
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_rope_scores_depend_only_on_relative_position():
    cos, sin = rope_tables(8, 32, 10000.0)
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> float:
        qm = apply_rope(q, cos[m : m + 1], sin[m : m + 1])
        kn = apply_rope(k, cos[n : n + 1], sin[n : n + 1])
        return float((qm * kn).sum())

    assert score(5, 2) == pytest.approx(score(13, 10), rel=1e-5)
    assert score(0, 0) == pytest.approx(float((q * k).sum()), rel=1e-6)


def test_every_layer_owns_its_alphas():
    model = Llama(tiny())
    with torch.no_grad():
        model.layers[1].mlp.act_fn.alpha_p.add_(1.0)
    scalars = model.activation_scalars()
    assert len(scalars) == 3
    assert scalars[0]["alpha_p"] == pytest.approx(0.8) and scalars[2]["alpha_p"] == pytest.approx(
        0.8
    )
    assert scalars[1]["alpha_p"] > 1.4  # softplus(a_p + 1)
    assert Llama(tiny(activation="relu2")).activation_scalars() == [{}, {}, {}]


def test_training_step_reaches_every_parameter():
    model = Llama(tiny())
    tokens = torch.randint(0, 96, (2, 16))
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_vocab_is_padded_from_the_tokenizer_unless_explicit():
    assert pad_vocab(131072, 128) == 131072 and pad_vocab(128256, 128) == 128256
    assert pad_vocab(50257, 128) == 50304
    assert ModelConfig().with_vocab_from_tokenizer(50257).vocab_size == 50304
    assert ModelConfig(vocab_size=147456).with_vocab_from_tokenizer(131072).vocab_size == 147456


def test_grouped_query_attention_is_multi_head_attention_with_each_group_copied():
    """The independent truth: a multi-head model whose key and value heads are the grouped
    model's, each repeated for the query heads of its group, computes the same logits."""
    torch.manual_seed(0)
    grouped = Llama(tiny(n_kv_heads=2)).double().eval()
    full = Llama(tiny()).double().eval()
    head_dim, group = 8, 2  # dim 32 over 4 heads; 2 query heads per key/value head
    state = grouped.state_dict()
    for name, tensor in list(state.items()):
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            heads = tensor.view(-1, head_dim, tensor.shape[1])  # [kv heads, head_dim, dim]
            state[name] = heads.repeat_interleave(group, dim=0).reshape(-1, tensor.shape[1])
    full.load_state_dict(state)
    tokens = torch.randint(0, 96, (2, 20))
    assert grouped.layers[0].self_attn.k_proj.weight.shape == (16, 32)
    torch.testing.assert_close(grouped(tokens), full(tokens), rtol=1e-12, atol=1e-12)
    doc_ids = torch.tensor([[0] * 8 + [1] * 12, [0] * 20])  # and through the document mask
    torch.testing.assert_close(
        grouped(tokens, document_ids=doc_ids), full(tokens, document_ids=doc_ids)
    )


def test_grouped_query_attention_counts_its_smaller_key_and_value_projections_in_flops():
    grouped, full = tiny(n_kv_heads=1), tiny()
    saved = 3 * 2 * 32 * (32 - 8)  # 3 layers, k and v, dim x (dim - one head's width)
    assert count_parameters(full).attention - count_parameters(grouped).attention == saved
    assert training_flops_per_token(full, 50) - training_flops_per_token(grouped, 50) == 6 * saved


def test_inconsistent_config_names_the_key():
    with pytest.raises(
        ValueError, match=r"model\.n_heads=4 is not a multiple of model\.n_kv_heads=3"
    ):
        ModelConfig(dim=32, n_heads=4, n_kv_heads=3)
    with pytest.raises(
        ValueError, match=r"model\.rope_scaling='yarn' is not one of linear, llama3"
    ):
        ModelConfig(rope_scaling="yarn")
    with pytest.raises(ValueError, match=r"model\.n_kv_heads=1 does not scale"):
        ModelConfig(dim=64, n_heads=2, n_kv_heads=1, parametrization="mup", mup_base_dim=32)
    with pytest.raises(ValueError, match=r"model\.dim=30 is not divisible by model\.n_heads=4"):
        ModelConfig(dim=30, n_heads=4)
    with pytest.raises(ValueError, match="'swiglo' is not known"):
        ModelConfig(activation="swiglo")


def test_document_mask_makes_a_packed_document_see_only_itself():
    torch.manual_seed(0)
    model = Llama(tiny()).eval()
    first, second = torch.randint(0, 96, (1, 7)), torch.randint(0, 96, (1, 9))
    packed = torch.cat([first, second], dim=1)
    doc_ids = torch.tensor([[0] * 7 + [1] * 9])
    with torch.no_grad():
        together = model(packed, document_ids=doc_ids)
        alone = model(second)
        unmasked = model(packed)
    torch.testing.assert_close(together[:, 7:], alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(together[:, :7], unmasked[:, :7])
    assert not torch.allclose(unmasked[:, 7:], alone, atol=1e-3)
