"""Per-layer statistics of the MLP activation's input and output: the regime it works in.

Whether an activation behaves as in the paper depends on the scale of what it is fed: xIELU is
almost its linear ``0.5 x`` term for small inputs, so a model whose pre-activations have RMS
0.23 (dim 128, init 0.02) trains a nearly linear MLP where the 1.1B (RMS 0.78) does not. These
numbers say, per layer, where each run is:

- ``pre_rms``: RMS of the activation's input (the gate's, for a gated MLP);
- ``neg_frac``: the fraction of that input below zero (the part xIELU's alpha_n shapes);
- ``out_rms``: RMS of the activation's output;
- ``nonlinear``: the share of the output's variance that no linear function of the input
  explains, ``1 - corr(input, output)^2`` (0 for a linear map, whatever its slope).

They are measured on one fixed held-out batch in a no-grad forward, so successive points and
different runs see the same tokens, and every rank's share is summed before dividing.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from data import IGNORE_INDEX
from training.runtime import distributed

STATISTICS = ("pre_rms", "neg_frac", "out_rms", "nonlinear")
# per layer, the sums the statistics are made of: n, sum x, sum x^2, #(x < 0), sum y, y^2, x*y
_SUMS = 7


def _sums(x: Tensor, y: Tensor) -> Tensor:
    x, y = x.detach().double().flatten(), y.detach().double().flatten()
    return torch.stack(
        [
            torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device),
            x.sum(),
            (x * x).sum(),
            (x < 0).sum().double(),
            y.sum(),
            (y * y).sum(),
            (x * y).sum(),
        ]
    )


def statistics_from_sums(sums: list[float]) -> dict[str, float]:
    """The four statistics from one layer's seven sums (see ``_sums``)."""
    n, sx, sxx, neg, sy, syy, sxy = sums
    var_x, var_y = sxx / n - (sx / n) ** 2, syy / n - (sy / n) ** 2
    cov = sxy / n - (sx / n) * (sy / n)
    linear = cov * cov / (var_x * var_y) if var_x > 0 and var_y > 0 else 1.0
    return {
        "pre_rms": math.sqrt(sxx / n),
        "neg_frac": neg / n,
        "out_rms": math.sqrt(syy / n),
        "nonlinear": max(0.0, 1.0 - linear),
    }


@torch.no_grad()
def mlp_diagnostics(
    model, batch: dict | None, device: torch.device, batch_shape: tuple[int, int]
) -> list[dict[str, float]]:
    """Per layer, the statistics above, over ``batch`` on every rank.

    ``model`` is a :class:`training.runtime.parallelize.TrainingModel` (every rank calls this: under
    DDP and FSDP2 the forward is a collective, so a rank without a batch runs one of zeros of
    ``batch_shape`` that counts for nothing); compiled blocks run eagerly here, since hooks
    added after compilation are not traced.
    """
    layers = model.bare.layers
    sums = torch.zeros(len(layers), _SUMS, dtype=torch.float64, device=device)
    counts = batch is not None
    if batch is None:
        batch = {
            "inputs": torch.zeros(batch_shape, dtype=torch.long),
            "targets": torch.full(batch_shape, IGNORE_INDEX, dtype=torch.long),
        }
    batch = {k: v.to(device) for k, v in batch.items()}

    def recorder(i: int):
        def hook(module, inputs, output):
            if counts:
                sums[i] += _sums(inputs[0], output)

        return hook

    handles = [
        layer.mlp.act_fn.register_forward_hook(recorder(i)) for i, layer in enumerate(layers)
    ]
    was_training = model.bare.training
    model.eval()
    try:
        with torch.compiler.set_stance("force_eager"), model.autocast():
            # the loss path: full logits would be batch x seq x vocab
            model(batch["inputs"], batch["targets"], batch.get("document_ids"))
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    flat = distributed.all_reduce_sum(sums.flatten().tolist(), device)
    if flat[0] == 0:  # no rank had a batch (data.validation_documents=0): nothing measured
        return []
    return [statistics_from_sums(flat[i * _SUMS : (i + 1) * _SUMS]) for i in range(len(layers))]


def diagnostic_scalars(per_layer: list[dict[str, float]]) -> dict[str, float]:
    """``diag/pre_rms/layer_00``-style keys, beside the alphas' ``alpha_p/layer_00``."""
    return {
        f"diag/{name}/layer_{i:02d}": value
        for i, stats in enumerate(per_layer)
        for name, value in stats.items()
    }
