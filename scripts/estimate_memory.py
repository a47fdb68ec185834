"""Peak GPU memory of one training step, estimated on a CPU without allocating it.

    python -m scripts.estimate_memory --preset paper_1b --batch 4 5 6
    python -m scripts.estimate_memory --preset paper_3b --batch 4 5 --activations xielu swiglu
    python -m scripts.estimate_memory --preset paper_3b --batch 4 --world-size 4   # FSDP2, 4 GPUs

The real code runs (``model.Llama``, ``training.runtime.parallelize.parallelize``, the fused loss,
bf16 autocast through ``TrainingModel.autocast``, AdamW from ``training.optim.build_optimizer``) on
fake tensors (``torch._subclasses.fake_tensor.FakeTensorMode``): every tensor has its shape,
dtype and lifetime but no data, so a 3B model costs seconds and no memory. PyTorch's own
tracker (``torch.distributed._tools.mem_tracker.MemTracker``; ``FSDPMemTracker`` under FSDP2)
sees each storage be created and freed and reports the peak by category. The step is the
trainer's own (``training.step.train_step``): ``--micro-steps`` micro-batches of forward and
backward (2 by default: with gradient accumulation, which the paper's global batches need,
the gradients of the first micro-batch stay alive through the second's forward and backward),
gradient clipping, the optimizer step, ``zero_grad``. A warm-up step runs first, untracked, so
that the optimizer state exists as in every step after the first.

Columns: "weights+grads+Adam" (fp32 parameters, gradients, AdamW's two moments; under FSDP2
also its unsharded bf16 compute copies and unsharded gradients), "activations" (tensors made by
a forward, or by the recomputation of a checkpointed block, still alive at the peak), "other"
(backward temporaries such as activation gradients, inputs, buffers, FSDP2's communication
buffers); they add up to "peak". (Under FSDP2 the tracker cannot tell a checkpointed block's
recomputation from other backward work, so those activations land in "other"; the peak is
right either way.) "fits" compares the peak with the usable memory of an 80 GB H100 and a
96 GB GH200 less ``--headroom`` (default 10%) for what the tracker cannot see: the CUDA context
(~0.5 GiB), cuBLAS/NCCL workspaces, the caching allocator's fragmentation. The margin printed
is what is left after the headroom.

What differs from a GPU, and how it is handled:

- Device. Fake tensors can carry ``device="cuda"`` in a CPU-only build, but autograd aborts on
  them (its input metadata needs the CUDA device guard, which this build lacks) and autocast
  refuses CUDA, so the estimate runs on device ``cpu``. CPU autocast casts the ops this model
  sends through it (``linear``, ``scaled_dot_product_attention``) to bf16 exactly as CUDA
  autocast does; the ops on CUDA's fp32 list (``pow``, ``rsqrt``, ``exp``, ``softplus``) only
  ever see tensors that RMSNorm, RoPE and the loss have already made fp32. Exception: ReLU²'s
  ``square`` of a bf16 tensor is upcast on CUDA and not here, so relu2 rows underestimate.
- Attention. On CPU, SDPA picks its flash kernel (``_scaled_dot_product_flash_attention_for_cpu``),
  which like CUDA's flash and cuDNN kernels saves q, k, v, the output and a [batch, heads, seq]
  log-sum-exp: O(seq), not the math path's O(seq²) probabilities. The step runs under
  ``sdpa_kernel(FLASH_ATTENTION)``, so a silent fallback to the math path is an error instead.
- Optimizer. ``build_optimizer`` picks fused AdamW on CUDA and foreach on CPU; the estimate asks
  for fused (``OptimConfig(fused=True)``), whose step allocates no temporaries, as on the GPU.
  ``--optimizer ademamix``: AdEMAMix's foreach step, whose temporaries (two lists the size of
  the parameters) count in the optimizer phase as they do on the GPU. ``--optimizer muon`` and
  ``normuon`` (``MUON_LIKE``): traced as fused AdamW (Muon's AdamW part reads its step count
  as a number, which fake tensors do not hold), then the state is Muon's: less the second
  moment and step count AdamW keeps for each hidden matrix, plus NorMuon's one element a row
  (``training.muon.state_elements_less_than_adamw``, checked against a real step's state in
  ``tests/test_estimate_memory.py``). Not counted: the exchange's buffers in the optimizer
  phase (under FSDP2 a rank holds its shards of every matrix and the whole of those it owns,
  about 3 P / W fp32 elements for P Muon elements over W ranks), Newton-Schulz's
  temporaries for one matrix, Nesterov's copy of the matrices' gradients (P / W) and the
  AdamW part's foreach temporaries (the embedding's and the head's size): an optimizer phase
  that rises to the peak under Muon does so by these.
- Allocator. The tracker counts bytes as requested (CUDA's allocator rounds to 512 B: a few MB
  over a few thousand tensors) and cannot see fragmentation: the headroom covers both.
- Compile. Eager only: ``torch.compile`` of each block (the trainer's ``compile: blocks``)
  fuses pointwise work and usually saves less for backward, so eager is an upper bound there.

One GPU (``--world-size 1``, the default) is what the trainer runs in a single process:
``parallelize`` applies FSDP2 only when there is more than one process, so there are no FSDP2
copies; instead autocast caches a bf16 copy of each block weight during forward (2 bytes per
block parameter, 1.7 GiB for paper_1b), and the matmuls save it for backward; it is counted
under "activations". ``--world-size N`` runs the trainer's FSDP2 path for N GPUs in this one
process, over a fake process group (``torch.testing._internal.distributed.fake_pg``): each rank
then keeps 1/N of the fp32 state, all-gathers one block's bf16 weights at a time (two with
prefetching), and, between the micro-batches of an accumulated step
(``set_requires_gradient_sync(False)``), keeps full unsharded fp32 gradients, unless
``--reduce-every-micro-batch`` (``parallel.fsdp_reduce_every_micro_batch``). The residual
stream stays fp32 as on one GPU (``training.runtime.parallelize.apply_fsdp``), so the q, k and v
projections each save their own autocast cast of the fp32 norm output, as on one GPU.

Not modelled: ``data.document_mask`` (off in the paper's configs; its [batch, 1, seq, seq] mask
and CUDA's mask-capable kernels), evaluation, checkpoint saving.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from itertools import repeat
from pathlib import Path

import torch
from torch import nn

from model.config import ModelConfig
from model.presets import available_presets
from scripts.common import markdown, write_csv
from training.muon import state_elements_less_than_adamw
from training.optim import OPTIMIZERS, OptimConfig
from training.parameter_groups import hidden_matrix_shapes
from training.runtime.parallelize import CHECKPOINTING
from training.step import train_step

GIB = 2**30
MUON_LIKE = ("muon", "normuon")  # traced as AdamW, their state counted (the docstring says why)
# Usable memory per GPU. H100 SXM 80GB: torch's total_memory, 79.2 GiB. GH200 96GB: taken as
# 95 GiB (96 GiB of HBM3 less the driver's reservation, as on the H100). The headroom below is
# ten times larger than the uncertainty in either figure.
DEVICES = {"H100 80GB": 79.2 * GIB, "GH200 96GB": 95.0 * GIB}
HEADROOM = 0.10

# tracker categories (the value of MemTracker's / FSDPMemTracker's enums) per column
STATE = {
    "Parameter",
    "Gradient",
    "Optstate",
    "Sharded Param",
    "Unsharded Param",
    "Sharded Grad",
    "Unsharded Grad",
    "OptState",
}
ACTIVATION = {"Activation"}
TOTAL = "Total"


@dataclass
class Estimate:
    """Bytes of one training step on one GPU, from the tracker's snapshots.

    Attributes:
        parameters: the model's parameters (all ranks, tied weights once).
        state: weights, gradients and optimizer state at the peak (FSDP2: this rank's shards
            plus the unsharded copies alive then).
        activations: forward (and recomputation) tensors alive at the peak.
        other: the rest of the peak: backward temporaries, inputs, buffers, FSDP2's
            all-gather and reduce-scatter buffers.
        peak: the largest total over the step (``state + activations + other``).
        peak_phase: where the peak happened (``forward 2``, ``backward 1``, ``optimizer``).
        saved: forward tensors alive right after the first micro-batch's forward (outside
            autocast): what autograd and checkpointing keep for backward.
        state_after_step: weights, gradients and optimizer state after ``optimizer.step()``,
            before ``zero_grad``.
    """

    parameters: int
    state: int
    activations: int
    other: int
    peak: int
    peak_phase: str
    saved: int
    state_after_step: int


def by_column(snapshot: dict) -> tuple[int, int, int]:
    """(state, activations, other) bytes of a tracker snapshot of one device."""
    totals = next(iter(snapshot.values()), {TOTAL: 0})
    named = {getattr(k, "value", k): v for k, v in totals.items()}
    state = sum(v for k, v in named.items() if k in STATE)
    activations = sum(v for k, v in named.items() if k in ACTIVATION)
    return state, activations, named[TOTAL] - state - activations


def fake_model(config: ModelConfig, fake_mode) -> nn.Module:
    """``Llama(config)`` with fake fp32 CPU tensors for parameters and buffers.

    Built on the meta device, then given fake storage: building it under the fake mode directly
    fails, because activations evaluate Python floats from tensors at construction (xIELU's
    integration constants), which fake tensors cannot provide. ``to_empty`` makes a new tensor
    per module and parameter, so tied parameters (the LM head and the embedding of a model with
    ``tie_embeddings``) are tied again afterwards, as ``Llama.__init__`` ties them.
    """
    from model import Llama

    with torch.device("meta"):
        model = Llama(config)
    shared = {}  # parameter object -> first name it appears under
    ties = []
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(prefix=module_name, recurse=False):
            if id(param) in shared:
                ties.append((module, name.rsplit(".", 1)[-1], shared[id(param)]))
            else:
                shared[id(param)] = name
    fake_mode.allow_non_fake_inputs = True  # the meta tensors, only while they are replaced
    try:
        with fake_mode:
            model.to_empty(device="cpu")
    finally:
        fake_mode.allow_non_fake_inputs = False
    for module, attribute, source in ties:
        setattr(module, attribute, model.get_parameter(source))
    return model


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[None]:
    """A process group of ``world_size`` ranks that are all this process (rank 0).

    Collectives return at once with outputs of the right shapes (the "fake" backend of
    ``torch.testing._internal.distributed.fake_pg``), so FSDP2 runs its real sharding,
    all-gathers and reduce-scatters, and the memory they take is counted.
    """
    if world_size == 1:
        yield
        return
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("--world-size > 1 needs its own process group; one is already set up")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def label_accumulated_gradients(tracker, model: nn.Module) -> None:
    """Count FSDP2's fp32 gradient accumulators as gradients, not as backward temporaries.

    Between the micro-batches of a step without gradient sync, FSDP2 moves each block's
    unsharded gradient into an fp32 accumulator (``FSDPParam.unsharded_accumulated_grad``).
    ``FSDPMemTracker`` labels the gradient autograd writes but not this copy, which, made during
    backward, it would file under "Temp". Only the label changes; the total is the same.
    """
    from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        for param in group.fsdp_params if group else ():
            if param.unsharded_accumulated_grad is not None:
                tracker._update_and_maybe_create_winfos(
                    param.unsharded_accumulated_grad, _FSDPRefType.UNSHARDED_GRAD
                )


def one_step(training, optimizer, tokens: torch.Tensor, micro_steps: int, mark) -> None:
    """The trainer's own step (``training.step.train_step``) on ``micro_steps`` copies of
    ``tokens``, with the default gradient clipping; ``mark(phase)`` after each part."""
    micro_batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    clip = OptimConfig().grad_clip
    train_step(training, optimizer, repeat(micro_batch), micro_steps, clip, on_phase=mark)


def estimate(
    config: ModelConfig,
    batch: int,
    seq: int,
    checkpointing: str = "none",
    world_size: int = 1,
    micro_steps: int = 2,
    reduce_every_micro_batch: bool = False,
    optimizer: str = "adamw",
) -> Estimate:
    """Peak memory of one bf16 training step of ``config`` on one of ``world_size`` GPUs,
    trained by ``optimizer`` (``optim.name``: AdEMAMix keeps a third fp32 moment)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from training.optim import build_optimizer
    from training.runtime.distributed import Env
    from training.runtime.parallelize import ParallelConfig, parallelize

    if micro_steps < 1 or world_size < 1:
        raise ValueError(
            f"micro_steps and world_size must be >= 1, got {micro_steps}, {world_size}"
        )
    device = torch.device("cpu")
    fake_mode = FakeTensorMode()
    plan = ParallelConfig(
        strategy="fsdp" if world_size > 1 else "none",
        precision="bf16",
        activation_checkpointing=checkpointing,
        fsdp_reduce_every_micro_batch=reduce_every_micro_batch,
    )
    with fake_process_group(world_size), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        model = fake_model(config, fake_mode)
        parameters = sum(p.numel() for p in model.parameters())
        # outside the fake mode: FSDP2's device mesh reads its rank list back from a tensor
        training = parallelize(model, Env(0, world_size, 0, device), plan)
        with fake_mode:
            traced = "adamw" if optimizer in MUON_LIKE else optimizer  # see MUON_LIKE
            fused = traced == "adamw"  # AdEMAMix has its foreach path only
            optim = build_optimizer(model, OptimConfig(name=traced, fused=fused), device)
            tokens = torch.randint(0, config.vocab_size, (batch, seq + 1), device=device)
            one_step(training, optim, tokens, 1, lambda phase: None)  # optimizer state
            if world_size > 1:
                tracker = FSDPMemTracker(model, optim)
                tracker.track_inputs((tokens,))
            else:
                tracker = MemTracker()
                tracker.track_external(model, optim, tokens)
            running_peak: list[tuple[str, int]] = []  # (phase, peak so far) after each phase
            current: dict[str, tuple[int, int, int]] = {}  # phase -> columns right after it

            def mark(phase: str) -> None:
                running_peak.append((phase, sum(by_column(tracker.get_tracker_snapshot("peak")))))
                current[phase] = by_column(tracker.get_tracker_snapshot("current"))
                if phase.startswith("backward"):
                    tracker.reset_mod_stats()  # per-module statistics (else: "one iteration only")
                    if world_size > 1:
                        label_accumulated_gradients(tracker, model)

            with tracker:
                one_step(training, optim, tokens, micro_steps, mark)
    state, activations, other = by_column(tracker.get_tracker_snapshot("peak"))
    less = 0
    if optimizer in MUON_LIKE:  # the matrices' second moment AdamW held, less NorMuon's rows
        shapes = hidden_matrix_shapes(config)
        less = 4 * state_elements_less_than_adamw(shapes, world_size, optimizer == "normuon")
    peak = state + activations + other
    phase = next(phase for phase, so_far in running_peak if so_far == peak)  # where it last rose
    state, peak = state - less, peak - less
    return Estimate(
        parameters=parameters,
        state=state,
        activations=activations,
        other=other,
        peak=peak,
        peak_phase=phase,
        saved=current["forward 1"][1],
        state_after_step=current["optimizer"][0] - less,
    )


def fits(peak: int, capacity: float, headroom: float) -> str:
    """``yes (12.3 GiB spare)`` / ``no (4.5 GiB over)``, against ``capacity`` less headroom."""
    spare = (capacity * (1 - headroom) - peak) / GIB
    return f"yes ({spare:.1f} GiB spare)" if spare >= 0 else f"no ({-spare:.1f} GiB over)"


def table(rows: list[dict], headroom: float) -> list[str]:
    header = [
        "activation",
        "checkpointing",
        "micro batch",
        "weights+grads+Adam GiB",
        "activations GiB",
        "other GiB",
        "peak GiB",
        "peak in",
        *(f"fits {name}" for name in DEVICES),
    ]
    body = [
        [
            r["activation"],
            r["checkpointing"],
            str(r["batch"]),
            f"{r['state'] / GIB:.1f}",
            f"{r['activations'] / GIB:.1f}",
            f"{r['other'] / GIB:.1f}",
            f"{r['peak'] / GIB:.1f}",
            r["peak_phase"],
            *(fits(r["peak"], capacity, headroom) for capacity in DEVICES.values()),
        ]
        for r in rows
    ]
    return markdown(header, body)


def main(argv: list[str] | None = None) -> list[dict]:
    from model.presets import load_preset

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="paper_1b", choices=available_presets())
    parser.add_argument("--activations", nargs="+", default=["xielu", "swiglu"])
    parser.add_argument("--batch", nargs="+", type=int, default=[5], help="micro batch sizes")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument(
        "--vocab-size", type=int, default=None, help="default: the preset's (tiny has none)"
    )
    parser.add_argument(
        "--checkpointing",
        nargs="+",
        default=list(CHECKPOINTING),
        choices=CHECKPOINTING,
    )
    parser.add_argument(
        "--world-size", type=int, default=1, help="GPUs; above 1 the trainer's FSDP2 path"
    )
    parser.add_argument(
        "--micro-steps",
        type=int,
        default=2,
        help="micro-batches per step: 1 = no gradient accumulation; 2 shows the steady state "
        "of any longer accumulation (gradients alive through forward)",
    )
    parser.add_argument(
        "--reduce-every-micro-batch",
        action="store_true",
        help="FSDP2: reduce-scatter gradients after every micro-batch "
        "(parallel.fsdp_reduce_every_micro_batch)",
    )
    parser.add_argument(
        "--optimizer",
        default="adamw",
        choices=list(OPTIMIZERS),
        help="optim.name: ademamix keeps a third fp32 moment; muon and normuon: see MUON_LIKE",
    )
    parser.add_argument("--headroom", type=float, default=HEADROOM)
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    rows = []
    for activation in args.activations:
        overrides = {"vocab_size": args.vocab_size} if args.vocab_size else {}
        config = load_preset(args.preset, activation=activation, max_seq_len=args.seq, **overrides)
        if config.vocab_size is None:
            parser.error(f"preset {args.preset!r} sets no vocabulary size: pass --vocab-size")
        for checkpointing in args.checkpointing:
            for batch in args.batch:
                result = estimate(
                    config,
                    batch,
                    args.seq,
                    checkpointing,
                    args.world_size,
                    args.micro_steps,
                    args.reduce_every_micro_batch,
                    args.optimizer,
                )
                rows.append(
                    {
                        "activation": activation,
                        "checkpointing": checkpointing,
                        "batch": batch,
                        **asdict(result),
                    }
                )
                print(
                    f"  {activation}, {checkpointing}, micro batch {batch}: "
                    f"{result.peak / GIB:.1f} GiB",
                    flush=True,
                )
    parameters = ", ".join(
        f"{a} {r['parameters'] / 1e9:.2f}B" for a, r in {r["activation"]: r for r in rows}.items()
    )
    print(
        f"\n{args.preset} ({parameters} parameters), seq {args.seq}, bf16 autocast, eager, "
        f"{args.micro_steps} micro-batch(es) per step, "
        + (f"FSDP2 over {args.world_size} GPUs" if args.world_size > 1 else "one GPU")
        + (", gradients reduced every micro-batch" if args.reduce_every_micro_batch else "")
        + f", {args.optimizer}"
        + f"; fits = peak <= usable memory less {args.headroom:.0%}\n"
    )
    print("\n".join(table(rows, args.headroom)))
    print(f"\nestimated in {time.perf_counter() - start:.0f} s")
    if args.csv:
        write_csv(rows, args.csv)
    return rows


if __name__ == "__main__":
    main()
