"""GPU types, named models, regions and prices: the planner's static knowledge.

See catalog.py. `default_catalog()` is the packaged data; `load_catalog(extra)` merges a
user's YAML on top.
"""

from sailplan.planner.catalog.catalog import (
    Catalog,
    CatalogError,
    GPUPower,
    GPUPrice,
    GPUSpec,
    ModelEntry,
    UnknownGPUError,
    UnknownModelError,
    default_catalog,
    load_catalog,
)

__all__ = [
    "Catalog",
    "CatalogError",
    "GPUPower",
    "GPUPrice",
    "GPUSpec",
    "ModelEntry",
    "UnknownGPUError",
    "UnknownModelError",
    "default_catalog",
    "load_catalog",
]
