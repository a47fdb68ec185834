"""Outlier telemetry: how heavy the tails of what each block's matmuls read are, per layer.

FP8 scales a tensor (or each row) by its absolute maximum, so one large value spends the 8 bits
of every other one: an activation whose outputs grow outliers breaks FP8 first, and the
kurtosis of activations predicts divergence (FOG, arXiv 2505.20524). Measured on the step's own
training micro-batches, in the step's own forward, per layer, for four tensors:

- ``pre_act``: the MLP activation's input (the gate's, for a gated MLP);
- ``act_out``: the activation's output, the down projection's input: the tensor an FP8 down
  projection quantizes, where FP8 breaks first;
- ``attn_out``: the attention's output, the output projection's input;
- ``residual``: the residual stream after the block.

and for each, four statistics:

- ``kurtosis``: E[(x - mean)^4] / Var(x)^2 over every element (3 for a normal distribution,
  1.8 for a uniform one; large: a few values far out);
- ``max_over_rms``: max|x| / RMS(x): how many RMS the largest value sits out;
- ``amax``: max|x|, the tensorwise FP8 scaling unit's maximum (over the step's micro-batches
  and ranks);
- ``row_amax_median``: the median over rows (tokens) of each row's max|x|, the rowwise scaling
  unit's typical maximum (the mean over micro-batches and ranks of their medians); ``amax``
  over it is what a tensorwise scale costs the typical row.

The moments are summed in float64 over micro-batches and ranks, so the statistics are those of
the whole global batch. On a due step the hooks are in place for that step only, its forward
runs eagerly (compiled blocks would not run hooks added after compilation) and recomputation
in backward (activation checkpointing) is not counted twice; the other steps pay nothing.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from training.components import Component, Context
from training.runtime import distributed

TENSORS = ("pre_act", "act_out", "attn_out", "residual")
# per layer and tensor, the sums: n, sum x, x^2, x^3, x^4, sum of row-amax medians, micro-batches
_SUMS = 7


def moment_sums(x: Tensor) -> list[Tensor]:
    """``[n, sum x, sum x^2, sum x^3, sum x^4]`` in float64, from an fp32 copy of ``x``."""
    x = x.detach().float()
    sq = x * x
    return [
        torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device),
        x.sum(dtype=torch.float64),
        sq.sum(dtype=torch.float64),
        (sq * x).sum(dtype=torch.float64),
        (sq * sq).sum(dtype=torch.float64),
    ]


def statistics(sums: list[float], amax: float) -> dict[str, float]:
    """The four statistics from one tensor's sums (``moment_sums`` then the row medians) and
    its absolute maximum."""
    n, s1, s2, s3, s4, medians, batches = sums
    mean = s1 / n
    var = s2 / n - mean * mean
    # the fourth central moment from the raw ones
    m4 = s4 / n - 4 * mean * s3 / n + 6 * mean * mean * s2 / n - 3 * mean**4
    rms = math.sqrt(s2 / n)
    return {
        "kurtosis": m4 / (var * var) if var > 0 else float("nan"),
        "max_over_rms": amax / rms if rms > 0 else float("nan"),
        "amax": amax,
        "row_amax_median": medians / batches,
    }


class Recorder:
    """The hooks of one measured step: per (layer, tensor), the sums and the maximum."""

    def __init__(self, layers, device: torch.device) -> None:
        shape = (len(layers), len(TENSORS))
        self.sums = torch.zeros(*shape, _SUMS, dtype=torch.float64, device=device)
        self.amax = torch.zeros(shape, dtype=torch.float64, device=device)
        self.handles = []
        for i, layer in enumerate(layers):
            found = _tensor_sources(layer)
            for j, tensor in enumerate(TENSORS):
                module, kind = found[tensor]
                hook = self._hook(i, j, kind)
                if kind == "output":
                    self.handles.append(module.register_forward_hook(hook))
                else:
                    self.handles.append(module.register_forward_pre_hook(hook))

    def _hook(self, i: int, j: int, kind: str):
        def hook(module, inputs, output=None):
            if torch._C._current_graph_task_id() != -1:  # recomputed in backward: seen already
                return
            x = output if kind == "output" else inputs[0]
            if isinstance(x, tuple):
                x = x[0]
            self.record(i, j, x)

        return hook

    @torch.no_grad()
    def record(self, i: int, j: int, x: Tensor) -> None:
        # amax, never max: selective checkpointing saves aten.max's outputs (float8 scales),
        # and an extra one in the forward would shift those that recomputation reads back
        x = x.detach()
        rows = x.reshape(-1, x.shape[-1]).abs().amax(dim=-1)
        sums = moment_sums(x)
        sums += [rows.float().median().double(), torch.ones((), dtype=torch.float64)]
        self.sums[i, j] += torch.stack([s.to(self.sums.device) for s in sums])
        self.amax[i, j] = torch.maximum(self.amax[i, j], rows.amax().double())

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def scalars(self, device: torch.device) -> dict[str, float]:
        """``outliers/<tensor>/<statistic>/layer_NN``, over every rank (a collective)."""
        sums = distributed.all_reduce_sum(self.sums.flatten().tolist(), device)
        amax = distributed.all_reduce_max(self.amax.flatten().tolist(), device)
        layers, width = self.sums.shape[0], len(TENSORS)
        out = {}
        for i in range(layers):
            for j, tensor in enumerate(TENSORS):
                k = i * width + j
                if sums[k * _SUMS] == 0:  # this layer never ran its forward
                    continue
                values = statistics(sums[k * _SUMS : (k + 1) * _SUMS], amax[k])
                for name, value in values.items():
                    out[f"outliers/{tensor}/{name}/layer_{i:02d}"] = value
        return out


def _tensor_sources(layer) -> dict[str, tuple[Any, str]]:
    """Where each tensor of ``TENSORS`` is read in one block (wrapped for checkpointing or
    not): the module and whether it is that module's input or its output."""
    modules = dict(layer.named_modules())
    suffix = {name.split("_checkpoint_wrapped_module.")[-1]: m for name, m in modules.items()}
    return {
        "pre_act": (suffix["mlp.act_fn"], "input"),
        "act_out": (suffix["mlp.down_proj"], "input"),
        "attn_out": (suffix["self_attn.o_proj"], "input"),
        "residual": (layer, "output"),
    }


class Outliers(Component):
    """Every ``logging.outliers_every`` steps, on that step's own forward passes; a step's own
    measurement, logged at that step (nothing is left for later)."""

    name = "outliers"
    on_cadence = ("step_start", "after_update")

    def __init__(self, every: int) -> None:
        self.every = every
        self.recorder: Recorder | None = None
        self.stance = None

    @classmethod
    def from_context(cls, context: Context) -> Outliers:
        return cls(context.config.logging.outliers_every)

    def step_start(self, trainer: Any, step: int) -> None:
        self.recorder = Recorder(trainer.model.bare.layers, trainer.env.device)
        self.stance = torch.compiler.set_stance("force_eager")
        self.stance.__enter__()

    def after_update(self, trainer: Any, step: int, stepped: bool) -> None:
        if self.recorder is None:
            return
        self._close()
        trainer.log(self.recorder.scalars(trainer.env.device), console=False, step=step)
        self.recorder = None

    def out_of_memory(self, trainer: Any) -> None:
        self.end(trainer, None)

    def end(self, trainer: Any, error: BaseException | None) -> None:
        if self.recorder is not None:
            self._close()
            self.recorder = None

    def _close(self) -> None:
        self.recorder.remove()
        if self.stance is not None:
            self.stance.__exit__(None, None, None)
            self.stance = None
