"""The catalog: what each GPU type is and costs, which models have names, where zones are.

Everything the planner knows about hardware and prices without measuring lives here as
data (planner/catalog/data/*.yaml, shipped as package data) behind one typed object. The
CLI, the operator (GKE accelerator labels -> GPU type), the profile estimator and the
simulator all ask the same Catalog, so a price or a spec is defined once. Users override
or extend it with their own YAML merged on top (`load_catalog(extra=...)`).

Lookups of unknown names raise `UnknownGPUError` / `UnknownModelError`, whose message lists
the valid names: the CLI turns them into a one-line error and exit 2.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from sailplan.planner.cluster import region_of
from sailplan.planner.modelspec import ModelSpec

GIB = 1024**3
DEFAULT_PRICE_REGION = "default"


class CatalogError(LookupError):
    """A name the catalog does not know, or a catalog file that does not parse."""

    def __str__(self) -> str:  # LookupError would quote a single argument like KeyError does not
        return str(self.args[0]) if self.args else ""


class UnknownGPUError(CatalogError):
    pass


class UnknownModelError(CatalogError):
    pass


class GPUPrice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    on_demand: float = Field(ge=0, description="USD per GPU-hour")
    spot: float = Field(ge=0, description="USD per GPU-hour on spot/preemptible capacity")


class GPUPower(BaseModel):
    """Power and SM clock figures of one GPU type, for the energy model (planner/energy).

    Every packaged value says its source in gpus.yaml; docs/architecture/planner.md lists
    them. A measured PowerProfile of the GPU type overrides them (planner.energy).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    tdp_watts: float = Field(
        gt=0,
        description="board power limit (datasheet TDP): the draw of dense training at the default clock",
    )
    idle_watts: float = Field(ge=0, description="draw of an idle GPU (no kernel running)")
    blocking_watts: float | None = Field(
        default=None,
        ge=0,
        description="draw while blocked in communication (NCCL waiting); None = idle_watts",
    )
    max_sm_mhz: int = Field(gt=0, description="maximum SM (graphics) clock: the default under load")
    min_sm_mhz: int = Field(gt=0, description="lowest SM clock the frequency planner considers")
    sm_step_mhz: int = Field(default=15, gt=0, description="step between settable SM clocks")

    @model_validator(mode="after")
    def _ordered(self) -> GPUPower:
        if self.idle_watts >= self.tdp_watts:
            raise ValueError(
                f"idle_watts {self.idle_watts} must be below tdp_watts {self.tdp_watts}"
            )
        if self.blocking_watts is not None and self.blocking_watts >= self.tdp_watts:
            raise ValueError(
                f"blocking_watts {self.blocking_watts} must be below tdp_watts {self.tdp_watts}"
            )
        if self.min_sm_mhz > self.max_sm_mhz:
            raise ValueError(f"min_sm_mhz {self.min_sm_mhz} is above max_sm_mhz {self.max_sm_mhz}")
        return self

    @property
    def block_watts(self) -> float:
        return self.idle_watts if self.blocking_watts is None else self.blocking_watts


class GPUSpec(BaseModel):
    """Public datasheet figures of one GPU type plus its list prices."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    memory_gib: float = Field(gt=0)
    peak_flops: float = Field(gt=0, description="dense bf16/fp16 tensor FLOP/s")
    bf16: bool = Field(
        default=True,
        description="computes bf16 (Ampere and later); Volta and Turing only fp16, so mixed "
        "precision there is fp16 with loss scaling",
    )
    memory_bandwidth_bytes_per_s: float = Field(gt=0)
    gpus_per_node: tuple[int, ...] = Field(min_length=1)
    intra_node_link: str
    intra_node_bytes_per_s: float = Field(gt=0)
    node_network_bytes_per_s: float = Field(gt=0, description="NIC bandwidth of one node")
    host_link_bytes_per_s: float | None = Field(
        default=None,
        gt=0,
        description="one GPU's link to host memory, one direction (PCIe or NVLink-C2C "
        "datasheet figure): prices optimizer offload; None = offload is not planned there",
    )
    host_memory_gib_per_gpu: float | None = Field(
        default=None,
        gt=0,
        description="host memory per GPU of every node of this type (a user's catalog "
        "override; wins over host_memory_gib_by_gpus); None = from the shapes",
    )
    host_memory_gib_by_gpus: dict[int, float] = Field(
        default_factory=dict,
        description="host memory of the documented machine shape by GPUs per node (GiB); "
        "empty = unknown (optimizer offload's host memory is then not checked)",
    )
    vm_egress_bytes_per_s: dict[int, float] = Field(
        default_factory=dict,
        description="documented network egress of a VM/node shape, by GPUs per node",
    )
    prices: dict[str, GPUPrice]
    aliases: tuple[str, ...] = ()
    power: GPUPower | None = Field(
        default=None, description="power and SM clocks for the energy model; None = unknown"
    )

    @model_validator(mode="after")
    def _has_default_price(self) -> GPUSpec:
        if DEFAULT_PRICE_REGION not in self.prices:
            raise ValueError(f"GPU {self.name}: prices need a '{DEFAULT_PRICE_REGION}' entry")
        return self

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def node_egress_bytes_per_s(self, gpus_per_node: int) -> float:
        """Documented NIC cap of a node with `gpus_per_node` of these GPUs.

        The shape's own figure, else the largest documented shape below it (a bigger VM is
        never slower), else node_network_bytes_per_s.
        """
        if gpus_per_node in self.vm_egress_bytes_per_s:
            return self.vm_egress_bytes_per_s[gpus_per_node]
        smaller = [n for n in self.vm_egress_bytes_per_s if n <= gpus_per_node]
        if smaller:
            return self.vm_egress_bytes_per_s[max(smaller)]
        return self.node_network_bytes_per_s

    def host_memory_gib_per_gpu_of(self, gpus_per_node: int | None) -> float | None:
        """Host memory per GPU of a node with `gpus_per_node` of these GPUs: the override,
        else its shape's, else (no such shape, or None) the least per GPU of the shapes;
        None where the catalog knows none."""
        if self.host_memory_gib_per_gpu is not None:
            return self.host_memory_gib_per_gpu
        shapes = self.host_memory_gib_by_gpus
        if gpus_per_node in shapes:
            return shapes[gpus_per_node] / gpus_per_node
        if not shapes:
            return None
        return min(gib / gpus for gpus, gib in shapes.items())

    def price(self, region: str, spot: bool) -> float:
        entry = self.prices.get(region) or self.prices[DEFAULT_PRICE_REGION]
        return entry.spot if spot else entry.on_demand


class ModelEntry(BaseModel):
    """A named model: its shape plus the published size used to check the shape."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: ModelSpec
    published_parameters: float | None = None
    published_counts_head: bool = True
    aliases: tuple[str, ...] = ()


class EgressPrices(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    same_zone: float = 0.0
    same_region: float = 0.01
    same_continent: float = 0.02
    intercontinental: float = 0.08
    intercontinental_remote: float = 0.15


class RegionEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    continent: str
    zones: tuple[str, ...] = ()


Relation = Literal["same-zone", "same-region", "same-continent", "intercontinental"]


class Catalog(BaseModel):
    """GPU types, named models, regions and egress prices, with alias-aware lookups."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: dict[str, GPUSpec]
    models: dict[str, ModelEntry]
    regions: dict[str, RegionEntry] = {}
    egress: EgressPrices = EgressPrices()
    remote_continents: tuple[str, ...] = ()
    continent_prefixes: dict[str, str] = {}

    _gpu_alias: dict[str, str] = PrivateAttr(default_factory=dict)
    _model_alias: dict[str, str] = PrivateAttr(default_factory=dict)

    def model_post_init(self, __context: Any) -> None:
        # Aliases are matched case-insensitively: GKE label values are lower case, Sailor's
        # names are mixed case, users type either.
        for name, gpu in self.gpus.items():
            for alias in (name, *gpu.aliases):
                self._gpu_alias[alias.lower()] = name
        for name, entry in self.models.items():
            for alias in (name, *entry.aliases):
                self._model_alias[alias.lower()] = name

    # -- GPUs --------------------------------------------------------------------------

    def gpu_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.gpus))

    def resolve_gpu(self, name_or_alias: str) -> str:
        """Canonical GPU name for a name, a Sailor name (`GH-96`) or a GKE label value."""
        canonical = self._gpu_alias.get(name_or_alias.lower())
        if canonical is None:
            raise UnknownGPUError(
                f"unknown GPU type {name_or_alias!r}; known: {', '.join(self.gpu_names())}"
            )
        return canonical

    def gpu(self, name: str) -> GPUSpec:
        return self.gpus[self.resolve_gpu(name)]

    def price_per_gpu_hour(
        self, gpu: str, region: str = DEFAULT_PRICE_REGION, spot: bool = False
    ) -> float:
        return self.gpu(gpu).price(region, spot)

    # -- models ------------------------------------------------------------------------

    def model_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.models))

    def resolve_model(self, name_or_alias: str) -> str:
        canonical = self._model_alias.get(name_or_alias.lower())
        if canonical is None:
            raise UnknownModelError(
                f"unknown model {name_or_alias!r}; known: {', '.join(self.model_names())} "
                "(or give a custom shape: hidden size, layers, heads, vocabulary, sequence length)"
            )
        return canonical

    def model(self, name: str) -> ModelSpec:
        return self.models[self.resolve_model(name)].spec

    def model_entry(self, name: str) -> ModelEntry:
        return self.models[self.resolve_model(name)]

    # -- geography and egress ----------------------------------------------------------

    def region_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.regions))

    def zones(self, region: str | None = None) -> tuple[str, ...]:
        if region is not None:
            entry = self.regions.get(region)
            return entry.zones if entry else ()
        return tuple(sorted(z for r in self.regions.values() for z in r.zones))

    def continent_of(self, region: str) -> str:
        """Continent of a region; names outside the GCP scheme are their own continent."""
        entry = self.regions.get(region)
        if entry is not None:
            return entry.continent
        for prefix, continent in self.continent_prefixes.items():
            if region.startswith(prefix):
                return continent
        return region

    def relation(self, zone_a: str, zone_b: str) -> Relation:
        if zone_a == zone_b:
            return "same-zone"
        region_a, region_b = region_of(zone_a), region_of(zone_b)
        if region_a == region_b:
            return "same-region"
        if self.continent_of(region_a) == self.continent_of(region_b):
            return "same-continent"
        return "intercontinental"

    def egress_usd_per_gb(self, zone_a: str, zone_b: str) -> float:
        """GCP price of moving one GB from zone_a to zone_b (symmetric)."""
        relation = self.relation(zone_a, zone_b)
        if relation == "same-zone":
            return self.egress.same_zone
        if relation == "same-region":
            return self.egress.same_region
        if relation == "same-continent":
            return self.egress.same_continent
        continents = {self.continent_of(region_of(zone_a)), self.continent_of(region_of(zone_b))}
        if continents & set(self.remote_continents):
            return self.egress.intercontinental_remote
        return self.egress.intercontinental


# -- loading ---------------------------------------------------------------------------


def _read_package_yaml(name: str) -> dict[str, Any]:
    text = resources.files("sailplan.planner.catalog").joinpath("data", name).read_text()
    loaded = yaml.safe_load(text)
    return loaded if isinstance(loaded, dict) else {}


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: the user's YAML adds entries or overrides single fields."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _build(raw: Mapping[str, Any]) -> Catalog:
    gpus: dict[str, GPUSpec] = {}
    for name, fields in (raw.get("gpus") or {}).items():
        try:
            gpus[name] = GPUSpec(name=name, **fields)
        except ValidationError as error:
            error.add_note(repr(name))  # which entry, for the one-line message
            raise
    models: dict[str, ModelEntry] = {}
    for name, fields in (raw.get("models") or {}).items():
        fields = dict(fields)
        meta = {
            key: fields.pop(key)
            for key in ("published_parameters", "published_counts_head", "aliases")
            if key in fields
        }
        try:
            models[name] = ModelEntry(spec=ModelSpec(name=name, **fields), **meta)
        except ValidationError as error:
            error.add_note(repr(name))
            raise
    return Catalog(
        gpus=gpus,
        models=models,
        regions={k: RegionEntry(**v) for k, v in (raw.get("regions") or {}).items()},
        egress=EgressPrices(**(raw.get("egress_usd_per_gb") or {})),
        remote_continents=tuple(raw.get("remote_continents") or ()),
        continent_prefixes=dict(raw.get("continent_prefixes") or {}),
    )


def _package_raw() -> dict[str, Any]:
    raw: dict[str, Any] = {}
    for name in ("gpus.yaml", "models.yaml", "regions.yaml"):
        raw = _merge(raw, _read_package_yaml(name))
    return raw


def load_catalog(extra: Path | Mapping[str, Any] | None = None) -> Catalog:
    """The packaged catalog with a user's YAML file (or mapping) merged on top.

    The user file has the same top-level keys as the packaged files (`gpus`, `models`,
    `regions`, `egress_usd_per_gb`); an entry with an existing name overrides only the
    fields it gives.
    """
    raw = _package_raw()
    if extra is not None:
        if isinstance(extra, Path):
            try:
                loaded = yaml.safe_load(extra.read_text())
            except (OSError, yaml.YAMLError) as error:
                raise CatalogError(f"cannot read catalog file {extra}: {error}") from error
            if not isinstance(loaded, Mapping):
                raise CatalogError(f"catalog file {extra} must hold a mapping at the top level")
            extra = loaded
        raw = _merge(raw, extra)
    try:
        return _build(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        detail = f"{where}: {first['msg']}" if where else first["msg"]
        entry = f" {error.title} {error.__notes__[0]}" if getattr(error, "__notes__", None) else ""
        raise CatalogError(f"invalid catalog{entry}: {detail}") from error
    except (TypeError, ValueError) as error:
        raise CatalogError(f"invalid catalog: {error}") from error


@cache
def default_catalog() -> Catalog:
    """The packaged catalog, parsed once per process."""
    return load_catalog()
