"""training.runtime.parallelize: activation checkpointing by wrapping, the plan read from the
config.

DDP and FSDP2 through the same function are exercised by ``tests/test_train_distributed.py``
(losses equal to a single process).
"""

import pytest
import torch

from model import Llama, ModelConfig
from training.checks import check_config
from training.runtime.distributed import Env
from training.runtime.parallelize import ParallelConfig, parallelize

CPU = Env(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def tiny_model(activation: str = "xielu") -> Llama:
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=128, dim=32, n_layers=2, n_heads=2, gated_hidden=64, max_seq_len=16,
        activation=activation,
    )  # fmt: skip
    return Llama(config).double()


def loss_and_grads(checkpointing: str, activation: str = "xielu", compile: str = "none"):
    plan = ParallelConfig(activation_checkpointing=checkpointing, compile=compile)
    model = parallelize(tiny_model(activation), CPU, plan)
    tokens = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(1))
    loss = model(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    grads = {name: p.grad for name, p in model.bare.state_dict(keep_vars=True).items()}
    return loss.detach(), grads


@pytest.mark.parametrize("activation", ["xielu", "swiglu"])
@pytest.mark.parametrize("checkpointing", ["full", "selective"])
def test_checkpointing_recomputes_exactly_the_gradients_autograd_keeps(checkpointing, activation):
    loss, grads = loss_and_grads("none", activation)
    recomputed_loss, recomputed = loss_and_grads(checkpointing, activation)
    assert torch.equal(loss, recomputed_loss)
    assert grads.keys() == recomputed.keys()
    for name, grad in grads.items():
        if grad is not None:
            torch.testing.assert_close(recomputed[name], grad, rtol=1e-12, atol=1e-15)


def test_checkpointing_wrappers_keep_the_models_state_dict_names():
    plain = tiny_model()
    wrapped = parallelize(tiny_model(), CPU, ParallelConfig(activation_checkpointing="full")).bare
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    wrapped.load_state_dict(plain.state_dict())  # strict: a plain checkpoint loads as it is


def saved_numbers(checkpointing: str) -> int:
    """Numbers autograd keeps for backward in one forward (saved-tensor hooks)."""
    model = parallelize(tiny_model(), CPU, ParallelConfig(activation_checkpointing=checkpointing))
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() // t.element_size()
        return t

    tokens = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens[:, :-1], tokens[:, 1:])
    return sum(kept.values())


def backward_op_counts(checkpointing: str) -> dict[str, int]:
    """How often backward runs matmuls and RMSNorm's rsqrt: recomputation shows up here."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    model = parallelize(tiny_model(), CPU, ParallelConfig(activation_checkpointing=checkpointing))
    tokens = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(1))
    loss = model(tokens[:, :-1], tokens[:, 1:])
    with Count() as count:
        loss.backward()
    return {"matmuls": count.ops["mm"] + count.ops["bmm"], "rsqrt": count.ops["rsqrt"]}


def test_full_checkpointing_keeps_least_and_selective_recomputes_no_matmul():
    assert saved_numbers("full") < saved_numbers("none")
    none, selective, full = (backward_op_counts(m) for m in ("none", "selective", "full"))
    assert none["rsqrt"] == 0 and selective["rsqrt"] > 0 and full["rsqrt"] > 0
    assert selective["matmuls"] == none["matmuls"] < full["matmuls"]


def test_the_settings_on_a_device_resolve_only_auto_precision():
    cpu = torch.device("cpu")
    plan = ParallelConfig(compile="model", activation_checkpointing="selective").on(cpu)
    assert (plan.compile, plan.activation_checkpointing, plan.bf16) == ("model", "selective", False)
    assert ParallelConfig(precision="bf16").on(cpu).precision == "bf16"
    assert ParallelConfig(precision="auto").on(torch.device("cuda", 0)).bf16
    assert ParallelConfig(precision="auto").on(cpu).precision == "fp32"
    fsdp = ParallelConfig(fsdp_reshard_after_forward=False, fsdp_reduce_every_micro_batch=True)
    plan = fsdp.on(cpu)
    assert (plan.fsdp_reshard_after_forward, plan.fsdp_reduce_every_micro_batch) == (False, True)


def test_unknown_checkpointing_mode_is_an_error_naming_the_key():
    from training.config import ExperimentConfig

    with pytest.raises(ValueError, match=r"parallel\.activation_checkpointing='some'"):
        check_config(ExperimentConfig(parallel=ParallelConfig(activation_checkpointing="some")))


def test_evaluation_plan_keeps_only_the_precision():
    plan = ParallelConfig(
        strategy="fsdp", precision="bf16", compile="blocks", activation_checkpointing="full"
    )
    assert plan.for_evaluation() == ParallelConfig(strategy="none", precision="bf16")


@pytest.mark.slow
def test_compiling_the_blocks_also_compiles_the_loss_and_changes_no_result(fresh_dynamo):
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from model.loss import chunk_loss_and_grad

    eager_loss, eager_grads = loss_and_grads("none")
    loss, grads = loss_and_grads("none", compile="blocks")
    assert _debug_get_cache_entry_list(chunk_loss_and_grad.__code__)  # the loss compiled
    # RMSNorm works in fp32 even in this fp64 model, and Inductor may skip that rounding
    torch.testing.assert_close(loss, eager_loss, rtol=1e-7, atol=0)
    for name, want in eager_grads.items():
        if want is not None:
            scale = want.abs().max().item()
            torch.testing.assert_close(grads[name], want, rtol=1e-5, atol=1e-6 * scale)


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_the_compile_backend_setting_reaches_every_compile_of_the_run(
    backend, fresh_dynamo, monkeypatch
):
    """``parallel.compile_backend``: a ``torch.compile`` that names no backend (the model's
    blocks, the loss) hands its graph to the one set, never to Inductor, whose entry point
    here raises; under the default, Inductor is reached."""
    import torch._inductor.compile_fx as inductor

    from training.runtime.parallelize import compile_backend

    def no_inductor(*args, **kwargs):
        raise AssertionError("Inductor was called")

    monkeypatch.setattr(inductor, "compile_fx", no_inductor)
    x = torch.randn(8)
    with compile_backend(backend):
        assert torch.equal(torch.compile(lambda t: t.sin() * 2)(x), x.sin() * 2)
    torch._dynamo.reset()
    with compile_backend("inductor"), pytest.raises(Exception, match="Inductor was called"):
        torch.compile(lambda t: t.cos() * 2)(x)


def test_a_compiled_run_takes_the_activation_path_measured_faster(monkeypatch):
    """``xielu.fused.ops.TRACED_FASTER`` names where the traced path won on a GPU: there an
    ``auto`` activation takes it when the run compiles, a backend set by hand is kept, and an
    eager run keeps the op (the traced path's point is Inductor's fusion)."""
    from xielu.fused import ops

    def backends(plan: ParallelConfig, **kwargs) -> set[str]:
        model = tiny_model()
        for layer in model.layers:
            layer.mlp.act_fn.backend = kwargs.get("backend", "auto")
        parallelize(model, CPU, plan)
        return {layer.mlp.act_fn.backend for layer in model.layers}

    compiled = ParallelConfig(compile="blocks")
    assert backends(compiled) == {"auto"}  # nothing measured faster
    monkeypatch.setattr(ops, "TRACED_FASTER", frozenset({("cpu", "fp32", "none")}))
    assert backends(compiled) == {"traced"}
    assert backends(compiled, backend="eager") == {"eager"}
    assert backends(ParallelConfig()) == {"auto"}
    assert backends(ParallelConfig(compile="blocks", precision="bf16")) == {"auto"}
