"""Which precision a plan trains in: bf16 where every GPU of the plan computes it, else fp16.

The trainer keeps fp32 parameters (the optimizer's master weights) and computes under
torch.autocast in the plan's precision; fp16 needs dynamic loss scaling, bf16 does not (it
has fp32's exponent range). Volta and Turing GPUs (V100, T4, RTX 20xx, Titan RTX) have no
bf16 (catalog field `bf16`), so a plan using any of them gets fp16. Called by planner.api
after the search; the search prices bf16 and fp16 alike (16-bit activations, fp32
gradients: simulator/memory.py), so the choice never changes which plan is best.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

from sailplan.planner.simulator.memory import Precision

if TYPE_CHECKING:
    from sailplan.planner.catalog import Catalog

PrecisionChoice = Literal["auto", "bf16", "fp16", "fp32"]


def resolve_precision(
    choice: PrecisionChoice, gpu_types: Iterable[str], catalog: Catalog
) -> Precision:
    """The precision a plan on `gpu_types` runs in: `choice` unless it is "auto"."""
    if choice != "auto":
        return choice
    if all(catalog.gpu(gpu).bf16 for gpu in gpu_types):
        return "bf16"
    return "fp16"
