"""bf16 training runs every matmul in bf16: no fp32 GEMM hides in a training step.

A fp32 product of weight-sized operands on a GPU runs on SIMT cores, not tensor cores: the
LM-head weight gradient once cost a third of an H100 iteration that way. A dispatch mode sees
every op of a real step (forward, fused loss, backward, AdamW) with its dtypes.
"""

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from model import Llama, ModelConfig
from model import loss as model_loss
from training.optim import OptimConfig, build_optimizer
from training.runtime.distributed import Env
from training.runtime.parallelize import ParallelConfig, parallelize

MATMULS = {
    "mm",
    "addmm",
    "addmm_",
    "bmm",
    "baddbmm",
    "baddbmm_",
    "addbmm",
    "addbmm_",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention",
}


class RecordMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, list[torch.dtype], list[int]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in MATMULS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            self.calls.append((name, [t.dtype for t in tensors], [t.numel() for t in tensors]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "activation,checkpointing,z_loss",
    [
        ("xielu", "none", 0.0),
        ("swiglu", "none", 0.0),
        ("xielu", "selective", 0.0),
        ("swiglu", "selective", 0.0),
        ("xielu", "none", 1e-4),  # the z-loss's gradient joins the same bf16 GEMMs
    ],
)
def test_a_bf16_training_step_has_no_fp32_matmul_of_weight_sized_operands(
    activation, checkpointing, z_loss, monkeypatch
):
    # the GPU's path: on a CPU the head's bf16 GEMMs are otherwise taken in fp32 for speed
    monkeypatch.setattr(model_loss, "BF16_GEMMS_IN_FP32_ON_CPU", False)
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=256, dim=64, n_layers=2, n_heads=4, gated_hidden=128, max_seq_len=32,
        activation=activation, loss_chunk_tokens=16,
    )  # fmt: skip
    cpu = torch.device("cpu")
    model = Llama(config)
    model.z_loss = z_loss
    training = parallelize(
        model,
        Env(0, 1, 0, cpu),
        ParallelConfig(precision="bf16", activation_checkpointing=checkpointing),
    )
    optimizer = build_optimizer(model, OptimConfig(), cpu)
    tokens = torch.randint(0, 256, (2, 33))
    smallest_weight = min(p.numel() for p in model.parameters() if p.ndim == 2)

    with RecordMatmuls() as record:
        with training.autocast():
            loss = training(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        optimizer.step()

    kinds = Counter(name for name, _, _ in record.calls)
    assert kinds["mm"] >= 3 * 7 * config.n_layers  # forward, two backward GEMMs per projection
    fp32_products = [
        (name, dtypes, sizes)
        for name, dtypes, sizes in record.calls
        if torch.float32 in dtypes and max(sizes) >= smallest_weight
    ]
    assert fp32_products == []
    assert loss.dtype == torch.float32 and torch.isfinite(loss)  # the loss itself stays fp32
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights


def test_fsdp2_blocks_see_the_fp32_residual_stream_and_rope_tables_as_one_gpu_does():
    """Under FSDP2 bf16, only the matmuls run in bf16 (autocast), as on one GPU and under DDP;
    the inputs of a block (residual stream, RoPE cos/sin) stay fp32."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    config = ModelConfig(
        vocab_size=256, dim=64, n_layers=2, n_heads=4, gated_hidden=128, max_seq_len=32,
        activation="xielu",
    )  # fmt: skip
    # two ranks in this one process: collectives return at once (weights are garbage, dtypes
    # are real), enough to see what FSDP2 hands each block
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        model = Llama(config)
        training = parallelize(
            model,
            Env(0, 2, 0, torch.device("cpu")),
            ParallelConfig(strategy="fsdp", precision="bf16"),
        )
        seen = []
        model.layers[0].register_forward_pre_hook(
            lambda module, args: seen.append([a.dtype for a in args if torch.is_tensor(a)])
        )
        tokens = torch.randint(0, 256, (2, 17))
        with training.autocast():
            training(tokens[:, :-1], tokens[:, 1:])
    finally:
        dist.destroy_process_group()
    assert seen == [[torch.float32] * 3]  # x, cos, sin
