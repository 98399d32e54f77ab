"""Analytic profiles for what nobody measured: a roofline per layer and link speeds from the catalog.

The planner must be able to plan for a GPU type or a (TP, micro-batch) point that has no
measured profile yet (a new pool, before its profiling Job ran). This module prices each
layer from the model shape and the GPU's datasheet:

- forward FLOPs of a block = 2 x (matmul parameters) x tokens + 4 x b x s^2 x h (QK^T and
  attention-over-V), split over TP; the head adds 2 x V x h x tokens; backward = 2 x forward;
  an encoder-decoder's decoder block adds cross-attention (Q and output over the t target
  tokens, K and V over the s encoder tokens, 4 x b x t x s x h); a convnet's layers are
  2 x the multiply-adds of their convolutions (a guess at the same efficiency: the
  calibration below was fitted on transformer layers);
- time = FLOPs / (peak x efficiency) + a fixed per-layer cost (kernel launches) + the
  layer's Megatron tensor-parallel all-reduces inside the node (two per block forward, two
  backward, one for the vocabulary-parallel embedding) at the node's datasheet link speed
  with NCCL's latencies (tensor_parallel_seconds);
- optimizer update = bytes the optimizer streams per parameter / memory bandwidth.

efficiency and per-layer cost are calibrated per GPU type against the measured Sailor
profiles (CALIBRATION below; tests/planner/test_profiles_estimate.py re-derives the error
when the artifact is present). Estimated profiles carry provenance `estimated` and lose to
any measured profile with the same key (ProfileSet), and complete_profiles() adds them only
where nothing was measured, so a plan can list exactly which inputs were guesses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from sailplan.planner.catalog import Catalog, CatalogError, GPUSpec
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.cleaning import monotone_in_micro_batch
from sailplan.planner.profiles.flops import layer_forward_flops
from sailplan.planner.profiles.rescale import rescale_profile
from sailplan.planner.profiles.tp_consistency import consistent_in_tensor_parallel
from sailplan.planner.profiles.transfer import PLAUSIBLE_RATIO_MARGIN, transfer_profile
from sailplan.planner.profiles.types import (
    LINK_CLASSES,
    BandwidthCurve,
    ComputeProfile,
    LinkClass,
    NetworkProfile,
    ProfileSet,
    Provenance,
)
from sailplan.planner.simulator.collectives import (
    NCCL_BASE_LATENCY_S,
    NVLINK_HOP_LATENCY_S,
    PCIE_HOP_LATENCY_S,
)

ROOFLINE_TOOL = "sailplan-roofline"
ROOFLINE_VERSION = "1"

# Bytes the optimizer reads and writes per parameter in one step (mixed precision):
# Adam reads fp16 grad + fp32 master, m, v and writes fp32 master, m, v + fp16 weight;
# SGD (no momentum) reads grad + master, writes master + fp16 weight.
OPTIMIZER_BYTES_PER_PARAM = {"adam": 2 + 12 + 12 + 2, "sgd": 2 + 4 + 4 + 2}


@dataclass(frozen=True)
class Calibration:
    """Fraction of peak FLOP/s reached by transformer layers, and a fixed cost per layer."""

    efficiency: float
    per_layer_s: float


# fit_calibration() on the Sailor artifact's measured profiles (every model, TP degree and
# micro-batch size measured on the GPU; blocks and head), after taking out the modelled TP
# all-reduces. Median relative error of a layer's forward+backward: A100-40 20%, A100-80
# 14%, GH200-96 14%, V100-16 3.6%, RTX-2080 22%, Titan-RTX 26%, RTX-3090 89% (its profile
# is erratic across micro-batch sizes). The efficiencies are low against datasheet peaks
# because the artifact's layer timings include framework hooks and unfused kernels; they
# are what training reached. tests/planner/test_profiles_estimate.py refits and checks them.
CALIBRATION: dict[str, Calibration] = {
    "A100-40": Calibration(efficiency=0.0703, per_layer_s=0.0),
    "A100-80": Calibration(efficiency=0.0999, per_layer_s=1.34e-3),
    "GH200-96": Calibration(efficiency=0.170, per_layer_s=0.0),
    "V100-16": Calibration(efficiency=0.0988, per_layer_s=3.29e-3),
    "RTX-2080": Calibration(efficiency=0.110, per_layer_s=6.27e-3),
    "RTX-3090": Calibration(efficiency=0.088, per_layer_s=4.85e-3),
    "Titan-RTX": Calibration(efficiency=0.035, per_layer_s=6.27e-3),
    # Same Hopper chip and datasheet peak as the GH200 (which the artifact measured).
    "H100-80": Calibration(efficiency=0.170, per_layer_s=0.0),
    "H200-141": Calibration(efficiency=0.170, per_layer_s=0.0),
}
# GPUs never measured (L4, T4, user additions): the median of the measured efficiencies.
DEFAULT_CALIBRATION = Calibration(efficiency=0.0988, per_layer_s=3.29e-3)


def calibration_for(gpu_type: str) -> Calibration:
    return CALIBRATION.get(gpu_type, DEFAULT_CALIBRATION)


def fit_calibration(
    measured: ProfileSet, catalog: Catalog, models: Mapping[str, ModelSpec] | None = None
) -> dict[str, tuple[Calibration, float]]:
    """Per GPU type: the Calibration that best explains its measured profiles, and its error.

    Every non-embedding layer of every measured profile is one point: measured
    forward + backward against 3 x forward FLOPs / peak. The per-layer cost is searched on
    a log grid; for each value the efficiency is the geometric median of the implied
    efficiencies, and the pair with the smallest median |log(predicted / measured)| wins.
    The returned error is the median relative error of the fit. Models come from `models`
    or the catalog by profile name; profiles of unknown models are ignored.
    """
    points: dict[str, tuple[list[float], list[float]]] = {}
    for profile in measured.compute:
        if profile.provenance.source != "measured" or profile.oom:
            continue
        try:
            model = (models or {}).get(profile.model) or catalog.model(profile.model)
            gpu = catalog.gpu(profile.gpu_type)
        except CatalogError:
            continue
        if len(profile.forward_s) != model.num_layers:
            continue
        xs, ys = points.setdefault(gpu.name, ([], []))
        for layer in range(1, model.num_layers):
            flops = layer_forward_flops(
                model, layer, profile.tensor_parallel, profile.micro_batch_size
            )
            # what the TP all-reduces took is not compute: fit the rest
            tp_forward, tp_backward = tensor_parallel_seconds(
                model, layer, profile.tensor_parallel, profile.micro_batch_size, gpu
            )
            xs.append(3.0 * flops / gpu.peak_flops)
            ys.append(
                profile.forward_s[layer] + profile.backward_s[layer] - tp_forward - tp_backward
            )
    fitted: dict[str, tuple[Calibration, float]] = {}
    for gpu_name, (xs, ys) in sorted(points.items()):
        x, y = np.asarray(xs), np.asarray(ys)
        best: tuple[float, Calibration, float] | None = None
        for per_layer in np.concatenate([[0.0], np.geomspace(1e-5, 2e-2, 60)]):
            usable = y > per_layer
            if usable.sum() < 0.9 * len(y):
                continue
            efficiency = float(np.exp(np.median(np.log(x[usable] / (y[usable] - per_layer)))))
            predicted = x / efficiency + per_layer
            score = float(np.median(np.abs(np.log(predicted / y))))
            if best is None or score < best[0]:
                relative = float(np.median(np.abs(predicted - y) / y))
                best = (score, Calibration(efficiency, float(per_layer)), relative)
        if best is not None:
            fitted[gpu_name] = (best[1], best[2])
    return fitted


def _tensor_parallel_all_reduces(
    model: ModelSpec, layer: int, micro_batch_size: int
) -> tuple[list[float], list[float]]:
    """(forward, backward) fp16 byte sizes of one layer's Megatron TP all-reduces.

    A block all-reduces its activation after attention and after the MLP in forward, and
    their input gradients in backward; an encoder-decoder's decoder block does the same for
    its cross-attention, and in backward the gradient of the encoder output its K and V
    projections read; the vocabulary-parallel embedding all-reduces its output in forward
    (an encoder-decoder's first decoder block embeds the targets the same way).
    """
    b, h = micro_batch_size, model.hidden_size
    encoder = 2.0 * b * model.sequence_length * h
    targets = 2.0 * b * model.target_length * h
    kind = model.layer_kind(layer)
    if kind == "embedding":
        return [encoder], []
    if kind == "decoder-block":
        forward = [targets] * 3
        if layer == model.first_decoder_layer:
            forward.append(targets)
        return forward, [targets] * 3 + [encoder]
    if kind == "block":
        return [encoder] * 2, [encoder] * 2
    return [], []


def tensor_parallel_seconds(
    model: ModelSpec, layer: int, tp: int, micro_batch_size: int, gpu: GPUSpec
) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's TP all-reduces on one GPU of the group.

    Each is a ring inside the node: 2 (tp - 1) / tp x bytes at the per-GPU link speed,
    2 (tp - 1) hops of NCCL latency (_tensor_parallel_all_reduces lists them).
    """
    if tp <= 1:
        return 0.0, 0.0
    hop = NVLINK_HOP_LATENCY_S if gpu.intra_node_link.startswith("nvlink") else PCIE_HOP_LATENCY_S

    def one(nbytes: float) -> float:
        return (
            NCCL_BASE_LATENCY_S
            + 2 * (tp - 1) * hop
            + 2.0 * (tp - 1) / tp * nbytes / gpu.intra_node_bytes_per_s
        )

    forward, backward = _tensor_parallel_all_reduces(model, layer, micro_batch_size)
    return sum(one(n) for n in forward), sum(one(n) for n in backward)


def estimate_compute_profile(
    model: ModelSpec,
    gpu: GPUSpec,
    tp: int,
    micro_batch_size: int,
    *,
    optimizer: str = "adam",
    calibration: Calibration | None = None,
) -> ComputeProfile:
    """Roofline profile of every layer of `model` on one GPU of a TP group."""
    cal = calibration or calibration_for(gpu.name)
    rate = gpu.peak_flops * cal.efficiency
    forward: list[float] = []
    backward: list[float] = []
    update: list[float] = []
    per_param = OPTIMIZER_BYTES_PER_PARAM.get(optimizer, OPTIMIZER_BYTES_PER_PARAM["adam"])
    for layer in range(model.num_layers):
        flops = layer_forward_flops(model, layer, tp, micro_batch_size)
        if model.layer_kind(layer) == "embedding":
            # a gather: bound by writing the output activation
            moved = 2.0 * micro_batch_size * model.sequence_length * model.hidden_size
            fwd = moved / gpu.memory_bandwidth_bytes_per_s + cal.per_layer_s / 4
            bwd = fwd
        else:
            fwd = flops / rate + cal.per_layer_s / 3
            bwd = 2.0 * flops / rate + 2 * cal.per_layer_s / 3
        tp_forward, tp_backward = tensor_parallel_seconds(model, layer, tp, micro_batch_size, gpu)
        forward.append(fwd + tp_forward)
        backward.append(bwd + tp_backward)
        update.append(
            model.layer_parameters(layer, tp) * per_param / gpu.memory_bandwidth_bytes_per_s
        )
    return ComputeProfile(
        model=model.name,
        gpu_type=gpu.name,
        tensor_parallel=tp,
        micro_batch_size=micro_batch_size,
        forward_s=tuple(forward),
        backward_s=tuple(backward),
        update_s=tuple(update),
        provenance=Provenance(
            source="estimated",
            tool=ROOFLINE_TOOL,
            tool_version=ROOFLINE_VERSION,
            gpu_name=gpu.name,
            note=f"efficiency {cal.efficiency:.3f}, per-layer {cal.per_layer_s * 1e3:.3f} ms",
        ),
    )


# -- network -----------------------------------------------------------------------------

# Share of a node's NIC bandwidth that NCCL reaches between nodes of one zone, the extra
# loss across zones, and the cap across regions. The Sailor artifact's GCP measurements:
# A100 VMs reach ~2.4 GB/s per GPU in a zone and across zones of one region alike, and
# ~0.6 GB/s (a quarter) to another region.
_INTRA_ZONE_SHARE = 0.8
_INTER_ZONE_SHARE = 0.75
_INTER_REGION_SHARE = 0.2
_LATENCY_S: dict[LinkClass, float] = {
    "intra-node": 1e-5,
    "intra-zone": 5e-5,
    "inter-zone": 5e-4,
    "inter-region": 1.5e-2,
}


def default_network_curve(
    catalog: Catalog, link: LinkClass, gpu_a: str, gpu_b: str, gpus_per_node: int = 1
) -> BandwidthCurve:
    """A flat bandwidth for a link class from the catalog's link and NIC speeds."""
    spec_a = catalog.gpu(gpu_a) if gpu_a else None
    spec_b = catalog.gpu(gpu_b) if gpu_b else spec_a
    if link == "intra-node":
        rate = 16e9 if spec_a is None else spec_a.intra_node_bytes_per_s
    else:
        nic = min(
            (s.node_network_bytes_per_s for s in (spec_a, spec_b) if s is not None),
            default=1.25e9,
        )
        # a TP group of g GPUs on a node with n GPUs gets g/n of the node's NIC; the
        # catalog gives the NIC of the largest node, so scale by the GPUs in use
        largest = max((max(s.gpus_per_node) for s in (spec_a, spec_b) if s is not None), default=1)
        nic *= min(1.0, max(1, gpus_per_node) / largest)
        share = {
            "intra-zone": _INTRA_ZONE_SHARE,
            "inter-zone": _INTRA_ZONE_SHARE * _INTER_ZONE_SHARE,
            "inter-region": _INTER_REGION_SHARE,
        }[link]
        rate = nic * share
    return BandwidthCurve(
        coefficients=(0.0, 0.0, rate / 1e9),
        max_bytes_per_s=rate,
        min_bytes_per_s=min(1e6, rate),
        latency_s=_LATENCY_S[link],
    )


def default_network_profile(
    catalog: Catalog, link: LinkClass, gpu_a: str, gpu_b: str, gpus_per_node: int = 0
) -> NetworkProfile:
    return NetworkProfile(
        link=link,
        gpu_type=gpu_a,
        peer_gpu_type="" if link == "intra-node" else gpu_b,
        gpus_per_node=gpus_per_node,
        curve=default_network_curve(catalog, link, gpu_a, gpu_b, max(1, gpus_per_node)),
        provenance=Provenance(
            source="estimated",
            tool=ROOFLINE_TOOL,
            tool_version=ROOFLINE_VERSION,
            note="from catalog link and NIC speeds",
        ),
    )


def grid_distance(point: tuple[int, int], tp: int, mbs: int) -> tuple[bool, float, int]:
    """How far grid point (TP, micro-batch) is from (tp, mbs): same TP first, then the
    nearest micro-batch size on a log scale (ties: the larger one, which is less
    launch-bound)."""
    other_tp, other_mbs = point
    return (
        abs(math.log2(other_tp / tp)) > 0,
        abs(math.log2(other_mbs / mbs)) + abs(math.log2(other_tp / tp)),
        -other_mbs,
    )


def _nearest_measured(
    measured: ProfileSet, model: str, gpu: str, tp: int, mbs: int
) -> ComputeProfile | None:
    """The measured point of the same model and GPU closest to (tp, mbs) (grid_distance)."""
    grid = measured.compute_grid(model, gpu)
    if not grid:
        return None
    best_tp, best_mbs = min(grid, key=lambda point: grid_distance(point, tp, mbs))
    profile = measured.compute_profile(model, gpu, best_tp, best_mbs)
    if profile is None or profile.oom or profile.provenance.source != "measured":
        return None
    return profile


def anchored_estimate(
    model: ModelSpec,
    gpu: GPUSpec,
    estimate: ComputeProfile,
    anchor: ComputeProfile,
    *,
    optimizer: str = "adam",
    calibration: Calibration | None = None,
) -> ComputeProfile:
    """Scale a profile (measured, or moved from another GPU) to another grid point by the
    roofline's ratio, layer by layer.

    The roofline is better at how time changes with micro-batch size or TP degree than at
    the absolute level on a given machine; the anchor fixes the level:
    t(target) = t(anchor) x roofline(target) / roofline(anchor). `estimate` is the
    roofline at the target, computed with `calibration` (None: the GPU's shipped one).
    """
    reference = estimate_compute_profile(
        model,
        gpu,
        anchor.tensor_parallel,
        anchor.micro_batch_size,
        optimizer=optimizer,
        calibration=calibration,
    )

    def scaled(
        target: tuple[float, ...], ref: tuple[float, ...], meas: tuple[float, ...]
    ) -> tuple[float, ...]:
        return tuple(m * t / r if r > 0 else t for t, r, m in zip(target, ref, meas, strict=True))

    same_tp = anchor.tensor_parallel == estimate.tensor_parallel
    return estimate.model_copy(
        update={
            "forward_s": scaled(estimate.forward_s, reference.forward_s, anchor.forward_s),
            "backward_s": scaled(estimate.backward_s, reference.backward_s, anchor.backward_s),
            # the optimizer step does not depend on the micro-batch size
            "update_s": anchor.update_s
            if same_tp
            else scaled(estimate.update_s, reference.update_s, anchor.update_s),
            "provenance": estimate.provenance.model_copy(
                update={
                    "note": f"roofline scaled from {anchor.provenance.source} {anchor.key} "
                    f"({anchor.provenance.tool})"
                }
            ),
        }
    )


@dataclass
class MovedGrid:
    """The model's measurements on other GPUs moved to `gpu` (transfer.transfer_profile),
    each grid point computed once: filling a grid asks for the same anchors at every point
    the transfer does not reach. Rooflines are priced for `optimizer` with `calibration`
    (None: the GPU's shipped one)."""

    model: ModelSpec
    gpu: GPUSpec
    measured: ProfileSet
    models: Mapping[str, ModelSpec]
    catalog: Catalog
    margin: float = PLAUSIBLE_RATIO_MARGIN
    optimizer: str = "adam"
    calibration: Calibration | None = None
    _moved: dict[tuple[int, int], ComputeProfile | None] = field(
        default_factory=dict, init=False, repr=False
    )

    @cached_property
    def _measured_elsewhere(self) -> frozenset[tuple[int, int]]:
        """The (TP, micro-batch) points the model was measured at on other GPUs."""
        return frozenset(
            (p.tensor_parallel, p.micro_batch_size)
            for p in self.measured.compute
            if p.model == self.model.name and p.gpu_type != self.gpu.name and not p.oom
        )

    def roofline(self, model: ModelSpec, tp: int, mbs: int) -> ComputeProfile:
        """`model`'s roofline profile on the grid's GPU (rescale.Roofline's shape)."""
        return estimate_compute_profile(
            model, self.gpu, tp, mbs, optimizer=self.optimizer, calibration=self.calibration
        )

    def at(self, tp: int, mbs: int) -> ComputeProfile | None:
        """The transfer at (tp, mbs); None when no qualified pair measured it."""
        if (tp, mbs) not in self._moved:
            self._moved[tp, mbs] = transfer_profile(
                self.model,
                self.gpu.name,
                tp,
                mbs,
                measured=self.measured,
                models=self.models,
                catalog=self.catalog,
                margin=self.margin,
            )
        return self._moved[tp, mbs]

    def anchored(self, tp: int, mbs: int) -> ComputeProfile | None:
        """The roofline at (tp, mbs) anchored to the transfer at the nearest other grid
        point it reaches (grid_distance, anchored_estimate); None when it reaches none."""
        elsewhere = self._measured_elsewhere - {(tp, mbs)}
        for point in sorted(elsewhere, key=lambda q: grid_distance(q, tp, mbs)):
            anchor = self.at(*point)
            if anchor is not None:
                return anchored_estimate(
                    self.model,
                    self.gpu,
                    self.roofline(self.model, tp, mbs),
                    anchor,
                    optimizer=self.optimizer,
                    calibration=self.calibration,
                )
        return None

    def rescaled(self, tp: int, mbs: int) -> ComputeProfile | None:
        """The roofline scaled by what `gpu` measured for other models of the model's
        family (rescale.rescale_profile); None when it measured none."""
        return rescale_profile(
            self.model,
            self.gpu.name,
            tp,
            mbs,
            measured=self.measured,
            models=self.models,
            roofline=self.roofline,
        )


def unmeasured_gpu_estimate(grid: MovedGrid, tp: int, mbs: int) -> ComputeProfile | None:
    """A model never measured on the grid's GPU, in order of trust
    (benchmarks/profile_transfer.py leaves each of the artifact's (model, GPU) out;
    docs/benchmarks.md):

    1. its measurement on another GPU scaled by a reference model's GPU ratio
       (transfer.transfer_profile, qualified pairs only);
    2. where no qualified pair has measured this point, the roofline anchored to that
       transfer at the nearest grid point it reaches (MovedGrid.anchored: the roofline
       says how time changes with micro-batch size and TP, the transfer fixes the level);
    3. the roofline scaled by what the GPU measured for other models of its family
       (MovedGrid.rescaled), which assumes a GPU reaches the same share of the roofline on
       every model: on the artifact's A100s GPT-Neo-2.7B reaches 2.3-2.6x the share
       OPT-350M does, so it is the fallback, not a partner to average with;

    None when none of the three reaches."""
    return grid.at(tp, mbs) or grid.anchored(tp, mbs) or grid.rescaled(tp, mbs)


def complete_profiles(
    model: ModelSpec,
    gpu_types: Iterable[str],
    tensor_parallel_degrees: Iterable[int],
    micro_batch_sizes: Iterable[int],
    *,
    measured: ProfileSet,
    catalog: Catalog,
    optimizer: str = "adam",
) -> ProfileSet:
    """`measured` plus an estimate for every grid point and link nobody measured.

    Measured compute profiles are first made non-decreasing in micro-batch size
    (cleaning.monotone_in_micro_batch). Compute: each (GPU type, TP, micro-batch) with no
    profile for the model gets a roofline profile (TP degrees the model cannot split are
    skipped), anchored to the nearest measured point of the same GPU type when there is
    one (anchored_estimate); with none on that GPU, unmeasured_gpu_estimate (the model's
    measurement on another GPU moved by a reference's GPU ratio, else the roofline anchored
    to such a move, else the same-GPU rescale) where it reaches, else the bare roofline.
    The estimates' time x TP is then made non-decreasing in TP degree against each other
    and the measured points
    (tp_consistency.consistent_in_tensor_parallel; measured profiles untouched). Network:
    each link class and GPU pair without a measured (or already present) profile gets a
    catalog default.
    """
    measured = monotone_in_micro_batch(measured)
    models: dict[str, ModelSpec] = {}
    for name in sorted({p.model for p in measured.compute}):
        try:
            models[name] = catalog.model(name)
        except CatalogError:
            continue  # a reference whose shape is unknown is still usable (transfer.py)
    gpus = sorted({catalog.resolve_gpu(g) for g in gpu_types})
    tps = sorted(set(tensor_parallel_degrees))
    mbss = sorted(set(micro_batch_sizes))
    compute: list[ComputeProfile] = []
    moved_grids: dict[str, MovedGrid] = {}
    for gpu in gpus:
        spec = catalog.gpu(gpu)
        for tp in tps:
            if not model.supports_tensor_parallel(tp):
                continue
            for mbs in mbss:
                if measured.compute_profile(model.name, gpu, tp, mbs) is None:
                    estimate = estimate_compute_profile(model, spec, tp, mbs, optimizer=optimizer)
                    anchor = _nearest_measured(measured, model.name, gpu, tp, mbs)
                    if anchor is not None:
                        estimate = anchored_estimate(
                            model, spec, estimate, anchor, optimizer=optimizer
                        )
                    else:
                        moved = moved_grids.setdefault(
                            gpu,
                            MovedGrid(model, spec, measured, models, catalog, optimizer=optimizer),
                        )
                        elsewhere = unmeasured_gpu_estimate(moved, tp, mbs)
                        estimate = elsewhere or estimate
                    compute.append(estimate)
    network: list[NetworkProfile] = []
    for link in LINK_CLASSES:
        pairs = (
            [(g, g) for g in gpus]
            if link == "intra-node"
            else [(a, b) for a in gpus for b in gpus if a <= b]
        )
        for a, b in pairs:
            peer = "" if link == "intra-node" else b
            if measured.network_profile(link, a, peer) is None:
                network.append(default_network_profile(catalog, link, a, b))
    completed = measured.merged(ProfileSet(compute=tuple(compute), network=tuple(network)))
    return consistent_in_tensor_parallel(completed)
