"""Importer for the Sailor artifact layout: users who profiled with Sailor bring their data.

Reads (all relative to the artifact root):
- profiles/<MODEL>/<GPU>/profile.json   {mbs: {tp: {layer: [fwd_s, bwd_s, update_s]}}}
- network/intra_node_bandwidths.json    {gpu: {gpus_per_vm: [[c0, c1, c2], max_Bps]}}
  (network/gcp_intra_node_bandwidths.json where the first is absent)
- network/multizone_bandwidths_het.json sender_zone -> gpu -> n -> receiver_zone -> gpu -> n
  (each pair of different zones becomes a zone-pair profile, sender first; every link
  class also gets the median of its pairs, for zone pairs the artifact did not measure)
- models/llm_info.json                  per-layer parameter and activation sizes
- validation plans (plan_from_sailor)   Sailor's plan dictionaries with measurements

and produces the project's own types: ComputeProfile / NetworkProfile with provenance
`measured`, tool `sailor-import` and the source path, names mapped through the catalog's
aliases (`GH-96` -> GH200-96, `OPT-350` -> OPT-350M). Sailor's bandwidth fit is the same
BandwidthCurve, so curves keep their meaning. Used by the store (a `--profiles` directory
that is a Sailor artifact), the accuracy benchmark and the CLI's `simulate --plan`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sailplan.planner.catalog import Catalog, CatalogError
from sailplan.planner.cluster import ClusterSnapshot, Pool, region_of
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.profiles.head_projection import with_head_projection
from sailplan.planner.profiles.types import (
    BandwidthCurve,
    ComputeProfile,
    LinkClass,
    NetworkProfile,
    ProfileSet,
    Provenance,
)

TOOL = "sailor-import"


class SailorFormatError(ValueError):
    """A file of the artifact does not have the shape this importer expects."""


@dataclass(frozen=True)
class SailorImport:
    profiles: ProfileSet
    skipped: tuple[str, ...] = ()  # one line per file or entry not imported, and why
    # one line per compute profile file rejected whole as not the model its folder names
    # (the import summary's warnings); also in `skipped`
    rejected: tuple[str, ...] = ()


def is_sailor_artifact(root: Path) -> bool:
    return (root / "profiles").is_dir() and any((root / "profiles").glob("*/*/profile.json"))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise SailorFormatError(f"cannot read {path}: {error}") from error


def _provenance(source: Path, gpu: str = "") -> Provenance:
    return Provenance(source="measured", tool=TOOL, gpu_name=gpu, note=f"from {source}")


# -- compute -----------------------------------------------------------------------------


def _layer_counts(data: Mapping[str, Any]) -> set[int]:
    return {
        len(layers)
        for by_tp in data.values()
        if isinstance(by_tp, Mapping)
        for layers in by_tp.values()
        if isinstance(layers, Mapping)
    }


def _fits_its_model(path: Path, data: Mapping[str, Any], catalog: Catalog) -> bool:
    try:
        model = catalog.model(path.parent.parent.name)
    except CatalogError:
        return False
    return model.num_layers in _layer_counts(data)


def rejected_files(root: Path, catalog: Catalog) -> dict[Path, str]:
    """Compute profile files that cannot be the model their folder names, and why.

    A file is rejected whole when none of its entries has the model's layer count (the
    file was profiled on another model), or when its content is identical to another
    model's file on the same GPU (a mislabelled copy: two models never time identically).
    The reason names the copy's original where there is one. Called by import_compute.
    """
    paths = sorted((root / "profiles").glob("*/*/profile.json"))
    contents: dict[Path, Any] = {}
    for path in paths:
        data = _read_json(path)
        if isinstance(data, Mapping):
            contents[path] = data
    reasons: dict[Path, str] = {}
    for path, data in contents.items():
        try:
            model = catalog.model(path.parent.parent.name)
        except CatalogError:
            continue  # import_compute reports the unknown name
        counts = _layer_counts(data)
        twins = [
            other
            for other, other_data in contents.items()
            if other != path and other.parent.name == path.parent.name and other_data == data
        ]
        twin = f" (identical to {twins[0]}: a mislabelled copy)" if twins else ""
        if counts and model.num_layers not in counts:
            reasons[path] = (
                f"{path}: rejected, its entries have "
                f"{'/'.join(str(c) for c in sorted(counts))} layers, {model.name} has "
                f"{model.num_layers}{twin}; {model.name} on this GPU is estimated instead"
            )
        elif any(_fits_its_model(other, contents[other], catalog) for other in twins):
            # the twin is as plausible as this file: which one was copied is unknowable
            reasons[path] = (
                f"{path}: rejected, identical to {twins[0]} (another model's profile: a "
                f"mislabelled copy); {model.name} on this GPU is estimated instead"
            )
    return reasons


def import_compute(
    root: Path, catalog: Catalog, rejected: Mapping[Path, str] | None = None
) -> tuple[list[ComputeProfile], list[str]]:
    profiles: list[ComputeProfile] = []
    skipped: list[str] = []
    reasons = rejected_files(root, catalog) if rejected is None else rejected
    for path in sorted((root / "profiles").glob("*/*/profile.json")):
        model_dir, gpu_dir = path.parent.parent.name, path.parent.name
        if path in reasons:
            skipped.append(reasons[path])
            continue
        try:
            model = catalog.model(model_dir)
            gpu = catalog.resolve_gpu(gpu_dir)
        except CatalogError as error:
            skipped.append(f"{path}: {error}")
            continue
        data = _read_json(path)
        if not isinstance(data, Mapping):
            raise SailorFormatError(f"{path}: expected an object keyed by micro-batch size")
        for mbs_key, by_tp in sorted(data.items(), key=lambda kv: int(kv[0])):
            for tp_key, layers in sorted(by_tp.items(), key=lambda kv: int(kv[0])):
                rows = [layers[k] for k in sorted(layers, key=int)]
                if len(rows) != model.num_layers:
                    skipped.append(
                        f"{path} mbs={mbs_key} tp={tp_key}: {len(rows)} layers, "
                        f"{model.name} has {model.num_layers}"
                    )
                    continue
                profiles.append(
                    with_head_projection(
                        ComputeProfile(
                            model=model.name,
                            gpu_type=gpu,
                            tensor_parallel=int(tp_key),
                            micro_batch_size=int(mbs_key),
                            forward_s=tuple(float(r[0]) for r in rows),
                            backward_s=tuple(float(r[1]) for r in rows),
                            update_s=_update_per_layer(rows),
                            provenance=_provenance(path, gpu),
                        ),
                        model,
                        catalog.gpu(gpu),
                    )
                )
    return profiles, skipped


def _update_per_layer(rows: list[Any]) -> tuple[float, ...]:
    """The optimizer-step column as per-layer seconds: each entry as measured.

    Sailor's profiler times one transformer block (its layers are identical, so it does not
    profile them all) and writes that block's optimizer step on every layer: the
    artifact's columns are constant. Each entry is one layer's step, not the whole
    model's. The whole-model reading is below what memory allows on every GPU and model
    of the artifact. Adam in fp32 streams 28 bytes per parameter (weights, gradients,
    two moments read; weights and moments written). On GH200 (4.0 TB/s) that puts
    OPT-350M's TP-4 step at 0.72 ms at least, against the 0.48 ms of one entry. OPT-30B's
    TP-1 entry (18.7 ms) is 4.3x one of its blocks' floor, but 1/11 of the whole model's
    (0.21 s); the whole model does not even fit on that GPU. Taken per layer, the entries
    sum to 12.5 ms for OPT-350M at TP 4. The two single-node runs of the artifact that
    differ only in their micro-batch count (1 and 32) put the per-iteration cost at
    11.6 ms (tests/planner/test_profiles_sailor.py checks both).
    Sailor's own simulator charges one entry per stage.
    """
    return tuple(float(r[2]) for r in rows)


# -- network -----------------------------------------------------------------------------


def _curve(entry: Any, source: Path) -> BandwidthCurve:
    try:
        (c0, c1, c2), max_bps = entry
        return BandwidthCurve(
            coefficients=(float(c0), float(c1), float(c2)), max_bytes_per_s=float(max_bps)
        )
    except (TypeError, ValueError) as error:
        raise SailorFormatError(f"{source}: bad bandwidth entry {entry!r}") from error


def _link_between(zone_a: str, zone_b: str) -> LinkClass:
    if zone_a == zone_b:
        return "intra-zone"
    if region_of(zone_a) == region_of(zone_b):
        return "inter-zone"
    return "inter-region"


def import_network(root: Path, catalog: Catalog) -> tuple[list[NetworkProfile], list[str]]:
    network: list[NetworkProfile] = []
    skipped: list[str] = []
    intra = root / "network" / "intra_node_bandwidths.json"
    if not intra.exists():
        intra = root / "network" / "gcp_intra_node_bandwidths.json"
    if intra.exists():
        for gpu_name, by_count in sorted(_read_json(intra).items()):
            try:
                gpu = catalog.resolve_gpu(gpu_name)
            except CatalogError as error:
                skipped.append(f"{intra}: {error}")
                continue
            for count, entry in sorted(by_count.items(), key=lambda kv: int(kv[0])):
                network.append(
                    NetworkProfile(
                        link="intra-node",
                        gpu_type=gpu,
                        gpus_per_node=int(count),
                        curve=_curve(entry, intra),
                        provenance=_provenance(intra, gpu),
                    )
                )
    het = root / "network" / "multizone_bandwidths_het.json"
    if het.exists():
        # Several zone pairs fall in one link class; keep the median one (by bandwidth of a
        # 64 MB message) so one unlucky or lucky measurement does not decide the class.
        groups: dict[tuple[LinkClass, str, str, int], list[BandwidthCurve]] = {}
        pairs: dict[tuple[str, str, str, str, int], tuple[LinkClass, BandwidthCurve]] = {}
        for zone_a, by_gpu in _read_json(het).items():
            for gpu_a_name, by_count in by_gpu.items():
                for count_a, by_zone in by_count.items():
                    for zone_b, by_gpu_b in by_zone.items():
                        for gpu_b_name, by_count_b in by_gpu_b.items():
                            entry = by_count_b.get(count_a)
                            if entry is None:
                                continue  # only equal GPU counts on both VMs are kept
                            try:
                                gpu_a = catalog.resolve_gpu(gpu_a_name)
                                gpu_b = catalog.resolve_gpu(gpu_b_name)
                            except CatalogError as error:
                                skipped.append(f"{het}: {error}")
                                continue
                            link = _link_between(zone_a, zone_b)
                            curve = _curve(entry, het)
                            groups.setdefault((link, gpu_a, gpu_b, int(count_a)), []).append(curve)
                            if zone_a != zone_b:
                                # the pair itself, in this direction (sender first)
                                pairs[(zone_a, gpu_a, zone_b, gpu_b, int(count_a))] = (link, curve)
        for (link, gpu_a, gpu_b, count), curves in sorted(groups.items()):
            ranked = sorted(curves, key=lambda c: c.bytes_per_second(64e6))
            median = ranked[(len(ranked) - 1) // 2]
            network.append(
                NetworkProfile(
                    link=link,
                    gpu_type=gpu_a,
                    peer_gpu_type=gpu_b,
                    gpus_per_node=count,
                    curve=median,
                    provenance=_provenance(het, gpu_a),
                )
            )
        for (zone_a, gpu_a, zone_b, gpu_b, count), (link, curve) in sorted(pairs.items()):
            network.append(
                NetworkProfile(
                    link=link,
                    gpu_type=gpu_a,
                    peer_gpu_type=gpu_b,
                    zone=zone_a,
                    peer_zone=zone_b,
                    gpus_per_node=count,
                    curve=curve,
                    provenance=_provenance(het, gpu_a),
                )
            )
    return network, sorted(set(skipped))


def import_artifact(root: Path, catalog: Catalog) -> SailorImport:
    """Every compute and network profile of a Sailor artifact directory."""
    rejected = rejected_files(root, catalog)
    compute, skipped_compute = import_compute(root, catalog, rejected)
    network, skipped_network = import_network(root, catalog)
    return SailorImport(
        profiles=ProfileSet(compute=tuple(compute), network=tuple(network)),
        skipped=tuple(skipped_compute + skipped_network),
        rejected=tuple(rejected[path] for path in sorted(rejected)),
    )


def load_llm_info(root: Path) -> dict[str, Any]:
    data = _read_json(root / "models" / "llm_info.json")
    if not isinstance(data, dict):
        raise SailorFormatError(f"{root / 'models' / 'llm_info.json'}: expected an object")
    return data


# -- plans -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SailorPlan:
    """A Sailor plan converted, with the measurements its file carries (if any)."""

    plan: Plan
    cluster: ClusterSnapshot
    measured_iteration_seconds: float | None = None
    measured_peak_memory_bytes: int | None = None


def plan_from_sailor(doc: Mapping[str, Any], model: ModelSpec, catalog: Catalog) -> SailorPlan:
    """Convert one Sailor plan dictionary (validation/*.json layout) into a Plan.

    Sailor lists, per stage, its data-parallel replicas as `[[[gpu, gpus_per_vm, zone]], tp]`.
    Each distinct (GPU type, zone, GPUs per VM) becomes a pool, with as many nodes as the
    plan uses (a TP group fills ceil(tp / gpus_per_vm) VMs). Several pipelines with the same
    stage boundaries are data-parallel replicas of one pipeline and are merged; pipelines
    with different boundaries have no Plan equivalent and are refused with the difference.
    """
    try:
        pipelines = list(doc["pipeline_list"])
        mbs = int(doc["mbs"])
        gbs = int(doc["gbs"])
        splits = [[list(stage) for stage in p["layers_per_stage"]] for p in pipelines]
        groups_per_pipeline = [p["tmp_per_stage"] for p in pipelines]
    except (KeyError, TypeError, IndexError, ValueError) as error:
        raise SailorFormatError(f"not a Sailor plan: missing {error}") from error
    if not pipelines:
        raise SailorFormatError("not a Sailor plan: pipeline_list is empty")
    for index, split in enumerate(splits[1:], start=1):
        if split != splits[0]:
            raise SailorFormatError(
                f"pipeline {index} splits the layers as {_layer_ranges(split)}, pipeline 0 as "
                f"{_layer_ranges(splits[0])}: pipelines with different stage boundaries are "
                "not supported"
            )

    pools: dict[tuple[str, str, int], int] = {}
    stages: list[Stage] = []
    for stage_index, layers in enumerate(splits[0]):
        replicas: list[Replica] = []
        tps: set[int] = set()
        for groups in groups_per_pipeline:
            for vms, tp in groups[stage_index]:
                gpu_name, per_vm, zone = vms[0]
                gpu = catalog.resolve_gpu(str(gpu_name))
                key = (gpu, str(zone), int(per_vm))
                pools[key] = pools.get(key, 0) + max(1, -(-int(tp) // int(per_vm)))
                replicas.append(Replica(pool=_pool_name(key), gpu_type=gpu, zone=str(zone)))
                tps.add(int(tp))
        if len(tps) != 1:
            raise SailorFormatError(f"stage with mixed TP degrees {sorted(tps)} is not supported")
        stages.append(
            Stage(
                layer_start=int(layers[0]),
                layer_end=int(layers[-1]) + 1,
                tensor_parallel=tps.pop(),
                replicas=tuple(replicas),
            )
        )
    dp = len(stages[0].replicas)
    if gbs % (mbs * dp):
        raise SailorFormatError(f"global batch {gbs} is not a multiple of mbs {mbs} x dp {dp}")
    plan = Plan(
        model=model,
        global_batch_size=gbs,
        micro_batch_size=mbs,
        num_micro_batches=gbs // (mbs * dp),
        stages=tuple(stages),
        reason="imported from a Sailor plan",
    )
    cluster = ClusterSnapshot(
        pools=tuple(
            Pool(name=_pool_name(key), gpu_type=key[0], zone=key[1], gpus_per_node=key[2], nodes=n)
            for key, n in sorted(pools.items())
        )
    )
    real = doc.get("real")
    mem = doc.get("max_mem")
    return SailorPlan(
        plan=plan,
        cluster=cluster,
        measured_iteration_seconds=float(real) if real is not None else None,
        measured_peak_memory_bytes=int(mem) if mem is not None else None,
    )


def _layer_ranges(split: list[list[Any]]) -> str:
    return ", ".join(f"{stage[0]}-{stage[-1]}" for stage in split if stage)


def _pool_name(key: tuple[str, str, int]) -> str:
    gpu, zone, per_vm = key
    return f"{gpu}-{zone}-x{per_vm}".lower()


def load_validation_plans(
    directory: Path, model: ModelSpec, catalog: Catalog
) -> list[tuple[str, SailorPlan]]:
    """Every Sailor plan file of a folder (validation/<setup>/*.json), by file stem."""
    plans: list[tuple[str, SailorPlan]] = []
    for path in sorted(directory.glob("*.json")):
        doc = _read_json(path)
        if not isinstance(doc, Mapping):
            raise SailorFormatError(f"{path}: expected a Sailor plan object")
        plans.append(
            (path.stem.removeprefix("plan_config_"), plan_from_sailor(doc, model, catalog))
        )
    return plans
