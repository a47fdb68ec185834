"""FP8 training through torchao: which linear layers compute in float8, and the refusals.

``parallel.float8=tensorwise`` (one scale per tensor) or ``rowwise`` (one per row of each
operand) swaps the chosen ``nn.Linear`` layers for torchao's ``Float8Linear``: the weights stay
fp32 master copies and the optimizer sees the same parameters under the same names, so
checkpoints, world-size changes and the optimizer's groups are untouched; only the matmuls run
in float8 (e4m3 for both directions, as torchao's recipes say), with dynamic scales computed
from each operand's absolute maximum at every call.

What stays in bf16 (``parallel.float8_keep``, names matched as whole dotted components or
suffixes, ``lm_head`` by default):

- the LM head: the fused loss (``model/loss.py``) reads its weight directly in chunks, never
  through the module, so converting it would change nothing but the checkpoint's dtype story;
  torchtitan keeps its output layer out of FP8 as well;
- layers whose shapes FP8 cannot take (a dimension not a multiple of 16, ``torch._scaled_mm``'s
  rule) or would not speed up (torchao's size thresholds, measured on H100s):
  ``parallel.float8_auto_filter`` (on by default) applies torchao's own filter for the recipe;
- the activation's scalars and the norms are not linear layers and stay fp32 anyway.

Under FSDP2 with ``tensorwise``, the blocks' weights are all-gathered in float8 (half bf16's
bytes) and their scales are computed for all of them in one fused pass after each optimizer
update (:class:`Float8Scales`, a component at ``after_update``). ``rowwise`` all-gathers in bf16:
torchao has no float8 all-gather for it.

Selective activation checkpointing saves the float8 matmuls' outputs as it saves ``mm``'s
(``torch._scaled_mm`` is in its list, ``training/runtime/parallelize.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import nn

from training.components import Component, Context

RECIPES = ("tensorwise", "rowwise")  # parallel.float8 is one of these or "none"
# e4m3 matmuls need compute capability 8.9 (Ada) or 9.0 (Hopper, the GH200) and above
MIN_CAPABILITY = (8, 9)


def refusal(recipe: str, precision: str, device: torch.device) -> str | None:
    """Why ``parallel.float8=recipe`` cannot run here (None: it can), said before any work."""
    if recipe == "none":
        return None
    if not torchao_available():
        return (
            f"parallel.float8={recipe} needs torchao: pip install -e '.[fp8]' "
            "(a torchao built for this torch), or set parallel.float8=none"
        )
    if device.type != "cuda":  # first: no other setting makes it run here
        return (
            f"parallel.float8={recipe} needs a CUDA GPU with FP8 matmuls (compute capability "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}+, e.g. H100/GH200); this device is "
            f"{device.type}: set parallel.float8=none"
        )
    if precision != "bf16":
        return f"parallel.float8={recipe} runs under bf16 autocast: set parallel.precision=bf16"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (
            f"parallel.float8={recipe}: {name} (compute capability {capability[0]}.{capability[1]})"
            " has no FP8 matmuls; set parallel.float8=none"
        )
    return None


def torchao_available() -> bool:
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        return False
    return True


def kept_by_name(name: str, keep: Sequence[str]) -> bool:
    """Whether a module's dotted ``name`` matches one of ``keep``: the whole name, or its last
    components (``down_proj`` keeps every block's, ``layers.0.mlp.down_proj`` only the first)."""
    return any(name == k or name.endswith("." + k) for k in keep)


def convert(
    model: nn.Module,
    recipe: str,
    keep: Sequence[str] = ("lm_head",),
    auto_filter: bool = True,
    fsdp: bool = False,
    emulate: bool = False,
) -> list[str]:
    """Swap ``model``'s linear layers for float8 ones, in place; returns the converted names.

    ``fsdp``: the model will be sharded with FSDP2 (tensorwise then all-gathers in float8).
    ``emulate``: compute the float8 matmuls in fp32 from the float8-rounded operands (torchao's
    emulation: CPU tests of the numerics; far slower, never for training).
    """
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear_utils import _auto_filter_for_recipe

    if recipe not in RECIPES:
        raise ValueError(f"float8 recipe {recipe!r} is not one of {RECIPES}")
    config = Float8LinearConfig.from_recipe_name(recipe)
    overrides = {"emulate": emulate}
    if recipe == "tensorwise":
        overrides["enable_fsdp_float8_all_gather"] = fsdp
    config = replace(config, **overrides)
    size_filter = _auto_filter_for_recipe(recipe, filter_fqns=[]) if auto_filter else None
    converted: list[str] = []

    def chosen(module: nn.Module, name: str) -> bool:
        if not isinstance(module, nn.Linear) or kept_by_name(name, keep):
            return False
        if any(d % 16 for d in module.weight.shape):
            return False
        if size_filter is not None and not size_filter(module, name):
            return False
        converted.append(name)
        return True

    convert_to_float8_training(model, module_filter_fn=chosen, config=config)
    return converted


class Float8Scales(Component):
    """After each optimizer update, the float8 scales of every FSDP2-sharded float8 weight in
    one fused pass (torchao's ``precompute_float8_dynamic_scale_for_fsdp``), so the next
    forward's float8 all-gathers need no per-layer amax reduction of their own."""

    name = "float8_scales"

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @classmethod
    def from_context(cls, context: Context) -> Float8Scales | None:
        """Only FSDP2 with float8 tensorwise all-gathers weights in float8 and needs scales."""
        model = context.model  # a TrainingModel
        return cls(model.bare) if model.plan.float8 == "tensorwise" and model.fsdp else None

    def after_update(self, trainer, step: int, stepped: bool) -> None:
        if not stepped:  # a skipped update left the weights, and so their scales, as they were
            return
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        precompute_float8_dynamic_scale_for_fsdp(self.model)
