"""The registry: names, gating, construction errors, and coverage of the paper's tables."""

import pytest
import torch

from xielu import activation_spec, available_activations, get_activation, is_gated

# Table 4 of the paper (ablations), row label -> registered name
ABLATION_TABLE = {
    "xIELU": "xielu",
    "xIPReLU": "xiprelu",
    "SwiGLU": "swiglu",
    "xIELU, positive component x^3": "xielu_pos_cubic",
    "xIELU, negative component xSiLU": "xielu_neg_xsilu",
    "xIELU, trainable beta_p = beta_n": "xielu_trainable_beta",
    "xIPReLU, fixed beta_p = beta_n = 0": "xiprelu_beta0",
    "xSiLU": "xsilu",
    "ReLU^2": "relu2",
    "xIELU, fixed beta_p = beta_n = 1": "xielu_beta1",
    "xIELU, negative component SiLU": "xielu_neg_silu",
    "xIELU, negative component set to 0": "xielu_neg_zero",
    "SiLU": "silu",
}
BASELINES = [
    "relu",
    "relu2",
    "gelu",
    "gelu_tanh",
    "silu",
    "elu",
    "xsilu",
    "swiglu",
    "geglu",
    "reglu",
]


def test_every_row_of_the_ablation_table_and_every_baseline_is_registered():
    names = set(available_activations())
    assert set(ABLATION_TABLE.values()) <= names
    assert set(BASELINES) <= names


def test_unknown_name_error_lists_the_valid_names():
    with pytest.raises(ValueError, match=r"'xielo' is not known; choose one of: xielu, xiprelu"):
        get_activation("xielo")


def test_unknown_option_error_names_the_accepted_ones():
    with pytest.raises(ValueError, match=r"does not accept \['alpha_init'\].*alpha_p_init"):
        get_activation("xielu", alpha_init=0.5)


def test_options_reach_the_constructor():
    act = get_activation("xielu", alpha_p_init=0.3, alpha_n_init=1.5)
    assert act.effective_scalars() == pytest.approx({"alpha_p": 0.3, "alpha_n": 1.5})


@pytest.mark.parametrize("name", available_activations())
def test_gated_flag_matches_the_module(name):
    module = get_activation(name)
    assert module.gated == is_gated(name) == (name in {"swiglu", "geglu", "reglu"})


@pytest.mark.parametrize("name", available_activations())
def test_trainable_scalars_are_one_element_vectors(name):
    """FSDP refuses 0-d parameters; every trainable scalar must have shape [1]."""
    for pname, param in get_activation(name).named_parameters():
        assert param.shape == (1,), pname
        assert param.dtype == torch.float32


def test_specs_carry_a_summary():
    assert "xIELU" in activation_spec("xielu").summary
    assert all(activation_spec(n).summary for n in available_activations())
