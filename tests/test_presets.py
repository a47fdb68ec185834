"""The Hydra model presets: every activation builds on every preset, at the paper's sizes."""

import pytest
import torch

from model import Llama, count_parameters
from model.presets import available_presets, load_preset
from xielu import available_activations

PAPER_LABELS = {"paper_1b": 1.1, "paper_3b": 3.0, "ablation_1b": 1.1}


def test_the_paper_presets_exist():
    assert {"tiny", "paper_1b", "paper_3b", "ablation_1b"} <= set(available_presets())


@pytest.mark.parametrize("preset", available_presets())
@pytest.mark.parametrize("activation", available_activations())
def test_every_activation_builds_on_every_preset(preset, activation):
    config = load_preset(preset, activation=activation)
    config = config.with_vocab_from_tokenizer(1000)  # the paper presets keep their own
    device = "cpu" if preset == "tiny" else "meta"  # the paper sizes cost no memory
    with torch.device(device):
        model = Llama(config)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(config).total
    if preset == "tiny":
        tokens = torch.randint(0, config.vocab_size, (1, 8))
        assert model(tokens).shape == (1, 8, config.vocab_size)


@pytest.mark.parametrize("preset", sorted(PAPER_LABELS))
def test_paper_presets_match_the_hyperparameter_tables(preset):
    swiglu = load_preset(preset, activation="swiglu")
    xielu = load_preset(preset, activation="xielu")
    table = {
        "paper_1b": (147456, 1536, 24, 6144, 9216, True, 4096),
        "paper_3b": (147456, 2048, 36, 8192, 12288, False, 4096),
        "ablation_1b": (128256, 1536, 24, 6144, 9216, True, 1024),
    }[preset]
    c = xielu
    assert (c.vocab_size, c.dim, c.n_layers, swiglu.hidden, c.hidden) == table[:5]
    assert (c.tie_embeddings, c.max_seq_len, c.n_heads, c.rope_theta) == (*table[5:], 16, 5e5)
    a, b = count_parameters(swiglu), count_parameters(xielu)
    assert a.total == b.total - b.activation_scalars
    assert round(a.total / 1e9, 1) == PAPER_LABELS[preset]


def test_tiny_takes_its_vocabulary_from_the_tokenizer():
    assert load_preset("tiny").vocab_size is None
    assert load_preset("tiny").with_vocab_from_tokenizer(128256).vocab_size == 128256
    assert load_preset("tiny").with_vocab_from_tokenizer(131073).vocab_size == 131200


def test_unknown_preset_or_key_is_named():
    with pytest.raises(ValueError, match=r"'paper_7b' not found.*tiny"):
        load_preset("paper_7b")
    with pytest.raises(ValueError, match="hidden_size"):
        load_preset("tiny", hidden_size=3)


def test_a_meta_model_is_initialised_by_whoever_materialises_it(monkeypatch):
    """On meta nothing is drawn (torch's random fill there is slow Python, and the values do
    not exist); ``to_empty`` and ``reset_parameters`` then give a CPU build's distributions."""
    config = load_preset("tiny").with_vocab_from_tokenizer(512)
    calls = []
    reset = Llama.reset_parameters
    monkeypatch.setattr(Llama, "reset_parameters", lambda self: calls.append(self) or reset(self))
    with torch.device("meta"):
        meta = Llama(config)
    assert calls == []
    torch.manual_seed(0)
    built = Llama(config)
    assert calls == [built]
    meta.to_empty(device="cpu")
    meta.reset_parameters()
    want_params = dict(built.named_parameters(remove_duplicate=False))
    for name, got in meta.named_parameters(remove_duplicate=False):
        want = want_params.pop(name)
        if name.endswith("norm.weight"):
            assert torch.equal(got, torch.ones_like(got)), name
        elif got.dim() == 2:
            assert got.std().item() == pytest.approx(want.std().item(), rel=0.1), name
    assert want_params == {}
