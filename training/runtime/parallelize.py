"""The one place that turns a model into the model that trains.

``parallelize(model, env, plan)`` applies, in this order (as torchtitan does, and for the same
reasons):

1. **activation checkpointing**, by wrapping each block (the model itself knows nothing of it;
   parameter and state-dict names do not change): ``full`` recomputes the whole block in
   backward, ``selective`` keeps the outputs of matmuls and attention that backward reads and
   recomputes only the cheap pointwise work (norms, RoPE, the activation);
2. **compile**: each (wrapped) block and the loss's softmax (``model/loss.py``), or the whole
   model;
3. **DDP or FSDP2** (``fully_shard`` each block, then the root: a block's all-gather overlaps the
   previous block's compute);
4. the **precision policy**: fp32 master weights; bf16 autocast for compute when ``bf16``, and
   under FSDP2 the blocks' matrices gathered in bf16 with fp32 gradient reduction, the blocks'
   norms and activation scalars whole on every rank in fp32 (``apply_fsdp`` says why), and
   everything else as on one GPU (fp32 residual stream, RoPE tables, embedding, final norm).

The result, a :class:`TrainingModel`, also answers the questions whose answer depends on the
wrapping (gradient sync during accumulation, the global gradient norm, finite weights, the
per-layer activation scalars), so the trainer has no ``strategy == ...`` branches. Evaluation
and the benchmarks call the same function, so they measure exactly what the trainer runs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from settings import ConfigError, Run, Section, at_least, one_of
from training.runtime.distributed import Env
from training.runtime.float8 import RECIPES as FLOAT8_RECIPES

STRATEGIES = ("ddp", "fsdp", "none")
PRECISIONS = ("auto", "bf16", "fp32")
COMPILE_SCOPES = ("none", "blocks", "model")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
CHECKPOINTING = ("none", "full", "selective")


@dataclass
class ParallelConfig(Section):
    """``parallel``: how the model trains on its devices, read by :func:`parallelize` (and by
    the FP8 conversion it calls); nothing else in the run changes with them.

    Attributes:
        strategy: ``ddp``, ``fsdp`` (FSDP2 ``fully_shard`` per block, then the root) or ``none``
            (every process keeps its own unwrapped copy: evaluation's; a training run on more
            than one process refuses it). Ignored in a single process.
        precision: ``auto`` (bf16 autocast on CUDA, fp32 on CPU), ``bf16`` (autocast for
            compute; fp32 weights and optimizer state) or ``fp32``.
        compile: ``none``, ``blocks`` (``torch.compile`` each block and the loss's softmax) or
            ``model`` (the whole model as one graph).
        compile_backend: what ``torch.compile`` hands the traced graphs to, for everything the
            run compiles: ``inductor`` (generated kernels: the speed), ``aot_eager`` (Dynamo and
            AOTAutograd trace the same graphs, which run eagerly: no code generation, whose C++
            build dominates a small run on a CPU; the tests' end-to-end tier uses it) or
            ``eager`` (Dynamo alone). Like torchtitan's ``compile.backend``.
        activation_checkpointing: ``none``, ``full`` (recompute each block in backward) or
            ``selective`` (keep matmul and attention outputs, recompute the pointwise work).
        float8: ``none``, ``tensorwise`` or ``rowwise``: the linear layers' matmuls in FP8
            through torchao (``pip install -e '.[fp8]'``; a GPU with compute capability 8.9+,
            bf16), one scale per tensor or per row; ``training/runtime/float8.py``.
        float8_keep: linear layers that stay bf16 under ``float8``, by name or name suffix
            (``lm_head``: the fused loss reads its weight; e.g. ``down_proj`` too).
        float8_auto_filter: also keep in bf16 the layers FP8 would not speed up (torchao's size
            thresholds for the recipe) or cannot take (a dimension not a multiple of 16).
        fsdp_reshard_after_forward: FSDP2: free each block's gathered weights after its forward
            (least memory) or keep them until its backward (one all-gather less per block).
        fsdp_reduce_every_micro_batch: FSDP2 with gradient accumulation: reduce-scatter the
            gradients after every micro-batch instead of keeping them whole, in fp32, until the
            last one: 4 bytes per parameter less on every GPU (4.2 GiB at 1.1B, 11.2 at 3B) for
            one reduce-scatter per micro-batch instead of per step.
        collective_timeout_s: how long a collective waits for the slowest rank before the job
            fails (a rank that hangs); a rank that dies stops the others at once (torchrun).
    """

    strategy: str = "ddp"
    precision: str = "auto"
    compile: str = "none"
    compile_backend: str = "inductor"
    activation_checkpointing: str = "none"
    float8: str = "none"
    float8_keep: list[str] = field(default_factory=lambda: ["lm_head"])
    float8_auto_filter: bool = True
    fsdp_reshard_after_forward: bool = True
    fsdp_reduce_every_micro_batch: bool = False
    collective_timeout_s: int = 1800

    def check(self, run: Run | None = None) -> None:
        one_of("parallel.strategy", self.strategy, STRATEGIES)
        one_of("parallel.precision", self.precision, PRECISIONS)
        one_of("parallel.compile", self.compile, COMPILE_SCOPES)
        one_of("parallel.compile_backend", self.compile_backend, COMPILE_BACKENDS)
        one_of("parallel.activation_checkpointing", self.activation_checkpointing, CHECKPOINTING)
        one_of("parallel.float8", self.float8, ("none", *FLOAT8_RECIPES))
        at_least("parallel.collective_timeout_s", self.collective_timeout_s, 1)
        if run is not None and run.world_size > 1 and self.strategy == "none":
            raise ConfigError(
                f"parallel.strategy=none on {run.world_size} processes: each would train its "
                "own copy, its gradients never averaged; use ddp or fsdp"
            )

    @property
    def bf16(self) -> bool:
        return self.precision == "bf16"

    def on(self, device: torch.device) -> ParallelConfig:
        """These settings for ``device``: ``auto`` precision resolved (bf16 on CUDA, fp32 on
        CPU, where bf16 matmuls are slow, not faster)."""
        return replace(self, precision=resolve_precision(self.precision, device))

    def for_evaluation(self) -> ParallelConfig:
        """Same precision, nothing else: evaluation keeps a whole unwrapped model per process."""
        return replace(
            self, strategy="none", compile="none", activation_checkpointing="none", float8="none"
        )


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto`` means bf16 on CUDA and fp32 on CPU (CPU bf16 matmuls are slow, not faster)."""
    if precision == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return precision


class TrainingModel:
    """A model as the training loop drives it, and what its wrapping changes.

    ``wrapped`` is what forward, backward and checkpoints go through (the DDP wrapper, or the
    model whose blocks FSDP2 sharded); ``bare`` is the ``Llama`` itself, for reading and for the
    optimizer (the same parameter objects; DTensor shards under FSDP2).
    """

    def __init__(self, wrapped: nn.Module, bare: nn.Module, plan: ParallelConfig, env: Env) -> None:
        self.wrapped, self.bare, self.plan, self.env = wrapped, bare, plan, env
        self.fsdp = plan.strategy == "fsdp" and env.distributed
        self.ddp = plan.strategy == "ddp" and env.distributed

    def __call__(self, *args, **kwargs):
        return self.wrapped(*args, **kwargs)

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.wrapped.parameters()

    def train(self, mode: bool = True) -> TrainingModel:
        self.wrapped.train(mode)
        return self

    def eval(self) -> TrainingModel:
        return self.train(False)

    def autocast(self) -> ContextManager:
        """The compute precision of a forward pass."""
        if not self.plan.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.env.device.type, dtype=torch.bfloat16)

    def gradient_sync(self, enabled: bool) -> ContextManager:
        """Reduce gradients over ranks only when ``enabled`` (the last micro-batch of a step), or
        after every micro-batch under FSDP2 with ``plan.fsdp_reduce_every_micro_batch``."""
        if self.ddp and not enabled:
            return self.wrapped.no_sync()
        if self.fsdp:
            self.wrapped.set_requires_gradient_sync(
                enabled or self.plan.fsdp_reduce_every_micro_batch
            )
        return contextlib.nullcontext()

    def _replicated(self) -> list[nn.Parameter]:
        """Under FSDP2, the parameters every rank keeps whole (``apply_fsdp``'s fp32 norms and
        activation scalars under bf16): not DTensors, so FSDP neither gathers nor reduces them."""
        if not self.fsdp:
            return []
        return [p for p in self.wrapped.parameters() if not hasattr(p, "to_local")]

    def finish_gradients(self) -> None:
        """Average the whole-on-every-rank parameters' gradients over ranks (in fp32, as FSDP2
        reduces the rest), once the step's last micro-batch has been backpropagated."""
        replicated = [p for p in self._replicated() if p.grad is not None]
        if not replicated:
            return
        import torch.distributed as dist

        flat = torch.cat([p.grad.reshape(-1).float() for p in replicated])
        dist.all_reduce(flat)
        flat /= self.env.world_size
        for param, grad in zip(
            replicated, flat.split([p.numel() for p in replicated]), strict=True
        ):
            param.grad.copy_(grad.view_as(param.grad))

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip to ``max_norm`` (``inf``: measure only); the global norm over all ranks, as a
        tensor (reading it waits for the device)."""
        params = [p for p in self.wrapped.parameters() if p.grad is not None]
        whole = [p for p in params if not hasattr(p, "to_local")]
        sharded = [p for p in params if hasattr(p, "to_local")]
        norm = None
        if whole:
            norm = torch.nn.utils.get_total_norm([p.grad for p in whole], foreach=True)
        if sharded:  # FSDP2: the norm of DTensor shards is itself a DTensor over the ranks
            grads = [p.grad for p in sharded]
            norm_sharded = torch.nn.utils.get_total_norm(grads, foreach=True).full_tensor()
            both = norm_sharded if norm is None else torch.stack([norm, norm_sharded])
            norm = torch.linalg.vector_norm(both)
        if norm is None:
            return torch.zeros((), device=self.env.device)
        for group in (whole, sharded):
            if group:
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm, foreach=True)
        return norm

    def local_weights_finite(self) -> bool:
        """Whether this rank's weights (its shards under FSDP2, its copy otherwise) are finite."""
        return all(
            bool(torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all())
            for p in self.wrapped.parameters()
        )

    def activation_scalars(self) -> list[dict[str, float]]:
        """Per-layer activation scalars, fp32 as the optimizer holds them (under bf16 FSDP2
        every rank keeps them whole; under fp32 FSDP2 each block is gathered to read them)."""
        if not self.fsdp or self.plan.bf16:
            return self.bare.activation_scalars()
        from torch.distributed.fsdp import FSDPModule

        sharded = [m for m in self.bare.layers.modules() if isinstance(m, FSDPModule)]
        for module in sharded:
            module.unshard()
        try:
            return self.bare.activation_scalars()
        finally:
            for module in sharded:
                module.reshard()


def parallelize(model: nn.Module, env: Env, plan: ParallelConfig) -> TrainingModel:
    """Wrap ``model`` (a decoder whose blocks are ``model.layers``) as ``plan`` (the run's
    ``parallel`` section) says, for ``env``'s device."""
    plan = plan.on(env.device)
    if plan.float8 != "none":  # first: checkpointing, compile and FSDP2 wrap the float8 layers
        from training.runtime import float8

        float8.convert(
            model,
            plan.float8,
            keep=plan.float8_keep,
            auto_filter=plan.float8_auto_filter,
            fsdp=env.distributed and plan.strategy == "fsdp",
        )
    if plan.activation_checkpointing != "none":
        apply_activation_checkpointing(
            model, selective=plan.activation_checkpointing == "selective"
        )
    if plan.compile != "none":
        take_the_measured_activation_path(model, env.device, plan)
    apply_compile(model, plan.compile)
    module = model
    if env.distributed and plan.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [env.local_rank] if env.device.type == "cuda" else None
        module = DistributedDataParallel(model, device_ids=ids)
    elif env.distributed and plan.strategy == "fsdp":
        apply_fsdp(model, plan)
    return TrainingModel(module, model, plan, env)


def take_the_measured_activation_path(model: nn.Module, device: torch.device, plan) -> None:
    """In a compiled run, xIELU and xIPReLU left at ``backend="auto"`` take the traced path where
    it was measured faster than the custom op for this device, precision and FP8 recipe
    (``xielu.fused.ops.TRACED_FASTER``); a backend set by hand
    (``model.activation_kwargs.backend=traced``) is kept."""
    from xielu import XIELU, XIPReLU
    from xielu.fused.ops import traced_is_faster

    if not traced_is_faster(device.type, plan.precision, plan.float8):
        return
    for module in model.modules():
        if isinstance(module, (XIELU, XIPReLU)) and module.backend == "auto":
            module.backend = "traced"


def compile_backend(backend: str):
    """A context in which every ``torch.compile`` of the run uses ``backend``
    (``parallel.compile_backend``): the model's, the loss's and FlexAttention's, without each
    call site taking it as an argument. Inductor, the default, changes nothing."""
    if backend == "inductor":
        return contextlib.nullcontext()
    return torch.compiler.set_stance("default", force_backend=backend)


def apply_compile(model: nn.Module, scope: str) -> None:
    """``torch.compile`` in place (names unchanged): each block and the loss's softmax, the whole
    model, or nothing."""
    if scope == "blocks":
        model.compile_blocks()
    elif scope == "model":
        model.compile()


def apply_fsdp(model: nn.Module, plan: ParallelConfig) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # The same numerics as one GPU and DDP, where autocast casts only the matmul operands:
    # blocks keep their inputs' dtype (FSDP2 would cast the residual stream and the RoPE tables
    # to bf16), and the root keeps its fp32 parameters, so the embedding starts the residual
    # stream in fp32 and the final norm runs in fp32; the LM head is cast for its matmul.
    blocks = (
        MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False
        )
        if plan.bf16
        else MixedPrecisionPolicy()
    )
    # The activation's scalars (alphas, a trainable beta) and the norms' weights stay out of
    # FSDP under bf16: gathered in bf16 with the block, softplus would run on bf16-rounded raw
    # alphas (0.80095 and 0.80045 both 0.80078). They are few (2 x dim + 3 per block), so every
    # rank keeps them whole, in fp32, as DDP under autocast uses them, and
    # ``TrainingModel.finish_gradients`` averages their gradients. Sharding them as FSDP units
    # of their own would put FSDP's hooks inside the block: under selective checkpointing the
    # recomputation then runs other bookkeeping ops than the forward did (a root pre-forward,
    # a prefetched all-gather) and backward fails; it would also cost three small all-gathers
    # per block and pass.
    reshard = plan.fsdp_reshard_after_forward
    for block in model.layers:
        whole = (
            {p for m in fp32_in_bf16_blocks(block) for p in m.parameters()} if plan.bf16 else None
        )
        fully_shard(block, mp_policy=blocks, reshard_after_forward=reshard, ignored_params=whole)
    # the root (embedding, final norm, head) is needed again at once by backward: keep it
    fully_shard(model, mp_policy=MixedPrecisionPolicy(), reshard_after_forward=False)


def fp32_in_bf16_blocks(block: nn.Module) -> list[nn.Module]:
    """The submodules of a block whose parameters stay fp32, whole on every rank, under bf16
    FSDP2: the norms and an activation that has trainable scalars."""
    from model.layers import RMSNorm

    keep = [m for m in block.modules() if isinstance(m, RMSNorm)]
    act = getattr(getattr(block, "mlp", None), "act_fn", None)
    if act is not None and any(True for _ in act.parameters()):
        keep.append(act)
    return keep


# ops whose outputs selective checkpointing keeps: the FLOPs; everything else is recomputed.
# Float8 linears (parallel.float8) multiply with _scaled_mm; their scales come from an absolute
# maximum (aten.max), kept too, so recomputation never re-reduces a whole operand for a scalar.
_SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten._scaled_mm.default,
    torch.ops.aten.max.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.higher_order.flex_attention,  # attention within documents (model.attention)
}
_LINEAR_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten._scaled_mm.default,
}


def keep_matmuls_but_the_last(linears_per_block: int) -> tuple[ContextManager, ContextManager]:
    """A selective-checkpointing policy for one block's forward (and its recomputation).

    It keeps matmul and attention outputs, except the block's last linear layer's (the MLP's
    down projection): nothing in backward reads that output, and recomputation stops as soon
    as it has rebuilt what backward reads, before it reaches that layer, so keeping it would
    only hold ``tokens x dim`` per layer (1.5 GB at the paper's 1.1B, batch 5 x 4096, eager).
    """
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(matmul_policy(linears_per_block))


def matmul_policy(linears_per_block: int):
    """The policy :func:`keep_matmuls_but_the_last` applies, per op. Linear layers are counted
    in call order; torch versions that also consult the policy during recomputation
    (``ctx.is_recompute``) get a count of their own there."""
    from torch.utils.checkpoint import CheckpointPolicy

    calls = {False: 0, True: 0}

    def policy(ctx, op, *args, **kwargs):
        if op in _LINEAR_OPS:
            calls[ctx.is_recompute] += 1
            if calls[ctx.is_recompute] == linears_per_block:
                return CheckpointPolicy.PREFER_RECOMPUTE
        if op in _SAVED_OPS:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def apply_activation_checkpointing(model: nn.Module, selective: bool = False) -> None:
    """Replace each block by a checkpointing wrapper of it (names in state dicts unchanged)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for index, block in enumerate(model.layers):
        kwargs = {"preserve_rng_state": False}  # the blocks draw no random numbers (no dropout)
        if selective:
            linears = sum(isinstance(m, nn.Linear) for m in block.modules())
            kwargs["context_fn"] = functools.partial(keep_matmuls_but_the_last, linears)
        model.layers[index] = checkpoint_wrapper(block, **kwargs)
