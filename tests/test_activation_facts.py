"""What an activation tells the rest of the project: its Hugging Face name, its trainable scalars.

Every registered activation states these facts on its registry line (``xielu.registry``); the
tests check each fact against the module it builds, and the model, optimizer and parameter count
against the facts.
"""

import pytest
import torch

from model import Llama, ModelConfig, count_parameters
from training.optim import OptimConfig, build_optimizer
from training.parameter_groups import parameter_groups, set_learning_rate
from xielu import (
    Activation,
    GatedActivation,
    XSiLU,
    activation_spec,
    available_activations,
    from_hf_name,
    get_activation,
)

EXPORTABLE = [n for n in available_activations() if activation_spec(n).hf_name() is not None]
# an activation with options, and the name transformers knows it by
OPTION_CASES = [
    ("gelu", {"approximate": "tanh"}, "gelu_pytorch_tanh"),
    ("geglu", {"approximate": "tanh"}, "gelu_pytorch_tanh"),
    ("gelu", {"approximate": "none"}, "gelu"),
    ("xielu", {"beta": 0.3, "eps": -1e-5, "alpha_n_init": 0.9}, "xielu"),
]


def _outputs(module: Activation, x: torch.Tensor) -> torch.Tensor:
    return module(x, x.flip(0)) if module.gated else module(x)


def test_exportable_activations_are_the_ones_with_a_transformers_counterpart():
    assert set(EXPORTABLE) == {
        "xielu",
        "relu",
        "relu2",
        "gelu",
        "gelu_tanh",
        "silu",
        "swiglu",
        "geglu",
        "reglu",
    }


@pytest.mark.parametrize("name", EXPORTABLE)
def test_every_hf_name_imports_back_to_the_same_function(name):
    spec = activation_spec(name)
    hf = spec.hf_name()
    back, options = from_hf_name(hf, gated=spec.gated)
    assert activation_spec(back).gated == spec.gated
    assert activation_spec(back).hf_name(**options) == hf
    x = torch.linspace(-6, 6, 1001)
    torch.testing.assert_close(
        _outputs(get_activation(back, **options), x), _outputs(get_activation(name), x)
    )


@pytest.mark.parametrize("name,options,hf", OPTION_CASES)
def test_options_choose_the_hf_name(name, options, hf):
    assert activation_spec(name).hf_name(**options) == hf


def test_import_prefers_the_activation_that_needs_no_options():
    assert from_hf_name("gelu_pytorch_tanh", gated=False) == ("gelu_tanh", {})
    assert from_hf_name("gelu_pytorch_tanh", gated=True) == ("geglu", {"approximate": "tanh"})
    assert from_hf_name("gelu", gated=True) == ("geglu", {})  # the default option is left out
    assert from_hf_name("silu", gated=True) == ("swiglu", {})
    assert from_hf_name("xielu", gated=True) is None
    assert from_hf_name("mish", gated=False) is None


def test_xielu_variants_are_exportable_only_under_the_name_xielu():
    """Its options travel in the state dict; an ablation built from the same class does not
    (transformers' xielu has no other beta than the buffer, but the ablation is its own row)."""
    assert activation_spec("xielu").hf_name(beta=1.0, alpha_n_init=1.3) == "xielu"
    assert activation_spec("xielu_beta1").hf_name() is None
    assert activation_spec("xiprelu").hf_name() is None


def test_unknown_options_are_refused_with_the_accepted_ones():
    with pytest.raises(ValueError, match=r"does not accept \['approx'\].*approximate"):
        activation_spec("gelu").hf_name(approx="tanh")


@pytest.mark.parametrize("name", available_activations())
def test_declared_hf_options_are_options_of_the_activation(name):
    spec = activation_spec(name)
    accepted = spec.options()
    buffers = dict(get_activation(name).named_buffers())
    for hf in spec.hf:
        assert set(hf.options) <= set(accepted), hf
        for option in hf.state_options:
            assert option in accepted and option in buffers, (hf, option)


@pytest.mark.parametrize("name", available_activations())
def test_declared_scalars_are_the_built_modules_parameters(name):
    spec = activation_spec(name)
    module = get_activation(name)
    assert isinstance(module, Activation) and module.gated == spec.gated
    names = tuple(n.rsplit(".", 1)[-1] for n, _ in module.named_parameters())
    assert names == spec.scalars
    assert sum(p.numel() for p in module.parameters()) == len(spec.scalars)
    assert list(module.scalar_parameters()) == list(module.parameters())
    # what is logged is exactly what is trained
    assert set(module.effective_scalars()) == set(spec.scalars)


@pytest.mark.parametrize("name", available_activations())
def test_parameter_count_asks_the_registry_and_matches_the_model(name):
    config = ModelConfig(
        vocab_size=64, dim=16, n_layers=2, n_heads=2, gated_hidden=32, activation=name
    )
    model = Llama(config)
    counted = count_parameters(config)
    assert counted.activation_scalars == 2 * len(activation_spec(name).scalars)
    assert counted.total == sum(p.numel() for p in model.parameters())


def test_a_glu_reports_its_gates_scalars():
    glu = GatedActivation(XSiLU(alpha_init=0.25))
    assert glu.effective_scalars() == pytest.approx({"alpha": 1.5})
    assert list(glu.scalar_parameters()) == [glu.gate_activation.alpha]


def test_folded_xielu_reports_the_alphas_it_was_folded_from():
    act = get_activation("xielu", alpha_p_init=0.3, alpha_n_init=1.5)
    folded = act.fold()
    assert folded.effective_scalars() == pytest.approx(act.effective_scalars())
    assert list(folded.scalar_parameters()) == []


@pytest.mark.parametrize("name", ["xielu", "xielu_trainable_beta", "xsilu", "swiglu", "relu2"])
@pytest.mark.parametrize("decay_scalars", [False, True])
def test_optimizer_groups_take_the_activation_scalars_the_activation_declares(name, decay_scalars):
    config = ModelConfig(
        vocab_size=64, dim=16, n_layers=3, n_heads=2, gated_hidden=32, activation=name
    )
    model = Llama(config)
    optim = OptimConfig(
        decay_norms_and_embeddings=True,
        decay_activation_scalars=decay_scalars,
        scalar_lr_multiplier=4.0,
    )
    groups = parameter_groups(model, optim)
    declared = list(model.activation_scalar_parameters())
    assert len(declared) == 3 * len(activation_spec(name).scalars)
    # norms and the embedding decay here, so only matrices, norms and the embedding are left
    assert groups[1]["params"] == []
    if declared:
        _, _, scalars = groups
        assert [id(p) for p in scalars["params"]] == [id(p) for p in declared]
        assert scalars["weight_decay"] == (0.1 if decay_scalars else 0.0)
        assert scalars["lr_multiplier"] == 4.0
    else:
        assert len(groups) == 2
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def test_the_scalar_group_trains_at_the_multiplied_rate():
    """``set_learning_rate`` gives the scalars ``lr * scalar_lr_multiplier``, everything else
    ``lr``; Adam's first step then moves each scalar by about its group's rate."""
    config = ModelConfig(vocab_size=64, dim=16, n_layers=2, n_heads=2, gated_hidden=32)
    model = Llama(config)
    # eps far below any gradient here, so Adam's first step is lr * sign(grad) to 1e-6
    optim = OptimConfig(scalar_lr_multiplier=5.0, eps=1e-20)
    optimizer = build_optimizer(model, optim, torch.device("cpu"))
    set_learning_rate(optimizer, 1e-3)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1e-3, 1e-3, 5e-3])
    before = [p.detach().clone() for p in model.activation_scalar_parameters()]
    matrix = model.layers[0].mlp.up_proj.weight
    matrix_before = matrix.detach().clone()
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    model(tokens, tokens.roll(1, 1)).backward()
    optimizer.step()
    moved = [
        (p - b).abs().item()
        for p, b in zip(model.activation_scalar_parameters(), before, strict=True)
    ]
    # Adam's first step is lr * sign(grad) (|m / sqrt(v)| = 1) for every nonzero gradient
    assert moved == pytest.approx([5e-3] * len(moved), rel=1e-3)
    step = (matrix - matrix_before).abs()
    # weight decay shrinks by lr * wd * w (~1e-6 here) on top of the lr-sized Adam step
    assert step.max().item() == pytest.approx(1e-3, rel=2e-2)


@pytest.mark.parametrize("name", ["xielu", "xielu_trainable_beta", "swiglu"])
def test_optimizer_groups_are_those_of_the_parameter_names(name):
    """The roles the activation declares are the ones its parameter names always implied: every
    parameter under ``mlp.act_fn`` (alphas, a trainable beta) and nothing else."""
    config = ModelConfig(
        vocab_size=64, dim=16, n_layers=2, n_heads=2, gated_hidden=32, activation=name
    )
    model = Llama(config)
    by_name = [p for n, p in model.named_parameters() if ".act_fn." in n]
    assert [id(p) for p in model.activation_scalar_parameters()] == [id(p) for p in by_name]
    decay, no_decay, *_ = parameter_groups(model, OptimConfig())
    decayed = [p for n, p in model.named_parameters() if n.endswith("proj.weight")]
    assert [id(p) for p in decay["params"]] == [id(p) for p in decayed]
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
