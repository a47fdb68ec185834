"""Per-layer gradient norms against a hand computation (DDP and FSDP2 log the same:
``tests/test_train_distributed.py -k fp32``)."""

import copy
import math

import pytest
import torch

from model import Llama, ModelConfig
from training.instruments.grad_norms import per_layer_grad_norms
from training.optim import OptimConfig, build_optimizer
from training.runtime.distributed import Env
from training.runtime.parallelize import ParallelConfig, parallelize
from training.step import train_step


@pytest.mark.parametrize("activation", ["xielu", "swiglu"])
def test_the_norms_are_those_of_each_blocks_gradients_before_clipping(activation):
    config = ModelConfig(
        vocab_size=64, dim=16, n_layers=2, n_heads=2, gated_hidden=32, activation=activation
    )
    torch.manual_seed(0)
    model = Llama(config)
    reference = copy.deepcopy(model)
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    # by hand: the loss's gradient on a copy, grouped by parameter name
    reference(batch["inputs"], batch["targets"]).backward()
    want = {}
    for i, layer in enumerate(reference.layers):
        groups = {"attn": 0.0, "mlp": 0.0, "act": 0.0}
        for name, p in layer.named_parameters():
            role = (
                "act"
                if ".act_fn." in f".{name}"
                else "mlp"
                if "mlp" in name or "post_att" in name
                else "attn"
            )
            groups[role] += float(p.grad.double().pow(2).sum())
        for role, total in groups.items():
            if role != "act" or activation == "xielu":
                want[f"grad_norm/{role}/layer_{i:02d}"] = math.sqrt(total)
    env = Env(0, 1, 0, torch.device("cpu"))
    trained = parallelize(model, env, ParallelConfig())
    optimizer = build_optimizer(model, OptimConfig(), env.device)
    got = {}
    # a tight clip: the norms must be read before it scales the gradients
    train_step(
        trained, optimizer, iter([batch]), 1, 1e-3,
        before_clip=lambda: got.update(per_layer_grad_norms(trained, env.device)),
    )  # fmt: skip
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6), key
    assert ("grad_norm/act/layer_00" in got) == (activation == "xielu")
