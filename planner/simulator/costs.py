"""The fast cost API: O(1) prices of stages, links and GPUs for the search, shared with simulate().

The search evaluates millions of candidate stages, so every quantity that depends on a
layer range is a difference of two prefix sums over a per-(GPU type, TP, micro-batch size)
table built once with numpy; link and price lookups are cached per key; nothing here builds
pydantic objects. simulate() (simulator/simulate.py) is written on top of these same
functions, so the search and the simulator agree exactly.

Conventions:
- layer ranges are half-open [a, b), as in Stage;
- an endpoint is anything with `pool`, `gpu_type` and `zone` (a plan Replica, or the
  search's own light tuples via `Endpoint`);
- byte counts passed to the link functions are what one TP group moves: the caller does not
  split them across TP ranks (the curve for the group's GPUs per node carries that).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from sailplan.planner.cluster import region_of
from sailplan.planner.profiles.memory import (
    ACTIVATION_BYTES,
    boundary_activation_bytes,
    layer_activation_bytes,
)
from sailplan.planner.profiles.selective import attention_core_bytes, attention_core_share
from sailplan.planner.profiles.types import (
    BandwidthCurve,
    LinkClass,
    Measure,
    NetworkProfile,
    Source,
    zone_pair_key,
)
from sailplan.planner.simulator.collectives import (
    NCCL_BASE_LATENCY_S,
    NETWORK_HOP_LATENCY_S,
    NVLINK_HOP_LATENCY_S,
    PCIE_HOP_LATENCY_S,
    AllReduceLayout,
)
from sailplan.planner.simulator.collectives import (
    allreduce_seconds as collective_allreduce_seconds,
)
from sailplan.planner.simulator.memory import Bytes, ModelStateBytes, model_state_bytes
from sailplan.planner.simulator.ties import (
    copy_parameter_matrix,
    shared_elements,
    shared_users,
)

if TYPE_CHECKING:
    from sailplan.planner.energy.power import EnergyModel
    from sailplan.planner.simulator.context import PlanningContext

FloatArray = npt.NDArray[np.float64]


JOULES_PER_KWH = 3.6e6  # 1 kWh = 1000 W x 3600 s


class MissingProfileError(LookupError):
    """Something the plan needs is not in the context: a compute profile (measured or
    estimated) for a GPU type / TP / micro-batch point, or the pool a replica names."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class EndpointLike(Protocol):
    @property
    def pool(self) -> str: ...
    @property
    def gpu_type(self) -> str: ...
    @property
    def zone(self) -> str: ...


E = TypeVar("E", bound=EndpointLike)


class Endpoint(NamedTuple):
    """A light stand-in for plan.Replica in the search's hot loop."""

    pool: str
    gpu_type: str
    zone: str


@dataclass(frozen=True)
class StageTable:
    """Prefix sums over layers for one (GPU type, TP, micro-batch size): entry i = sum of layers < i."""

    gpu_type: str
    tensor_parallel: int
    micro_batch_size: int
    forward: FloatArray
    backward: FloatArray
    update: FloatArray
    params: FloatArray  # parameters per TP rank
    activations: FloatArray  # bytes kept for backward per micro-batch per TP rank
    # full recomputation keeps each layer's output (the next layer's input), not its
    # activations: prefix sums of those bytes, and each layer's activations (not summed:
    # the backward recomputes one layer at a time, so a stage's largest is live at once)
    kept_outputs: FloatArray | None = None
    layer_activations: FloatArray | None = None
    # selective recomputation (profiles/selective.py): each layer's attention-core bytes (not
    # summed: the backward recomputes one layer's core at a time) and prefix sums of the
    # forward seconds of the cores it runs again
    attention_core: FloatArray | None = None
    core_forward: FloatArray | None = None
    # parameters per TP rank of the copies of shared parameters (tied embeddings) a stage
    # holding [a, b) keeps at [a, b] (simulator/ties.py): not a prefix sum, a matrix
    copies: FloatArray | None = None

    def forward_backward_seconds(self, a: int, b: int) -> float:
        return float(self.forward[b] - self.forward[a] + self.backward[b] - self.backward[a])

    def forward_seconds(self, a: int, b: int) -> float:
        return float(self.forward[b] - self.forward[a])

    def backward_seconds(self, a: int, b: int) -> float:
        return float(self.backward[b] - self.backward[a])

    def update_seconds(self, a: int, b: int) -> float:
        return float(self.update[b] - self.update[a])

    def parameters(self, a: int, b: int) -> float:
        """Parameters per TP rank of a stage holding [a, b): its layers' and the copies it
        keeps of shared parameters whose owner is on another stage (simulator/ties.py)."""
        own = float(self.params[b] - self.params[a])
        return own + (float(self.copies[a, b]) if self.copies is not None else 0.0)

    def parameter_matrix(self) -> FloatArray:
        """`parameters` for every layer range: M[a, b] (meaningful for a < b)."""
        matrix: FloatArray = self.params[None, :] - self.params[:, None]
        return matrix + self.copies if self.copies is not None else matrix

    def activation_bytes(self, a: int, b: int) -> float:
        return float(self.activations[b] - self.activations[a])

    def recompute_kept_bytes(self, a: int, b: int) -> float:
        """Bytes a fully recomputed stage keeps per micro-batch: its layers' outputs."""
        assert self.kept_outputs is not None
        return float(self.kept_outputs[b] - self.kept_outputs[a])

    def largest_layer_activation_bytes(self, a: int, b: int) -> float:
        assert self.layer_activations is not None
        return float(self.layer_activations[a:b].max())

    def attention_core_bytes(self, a: int, b: int) -> float:
        """Bytes the attention cores of layers [a, b) keep per micro-batch without recomputation."""
        assert self.attention_core is not None
        return float(self.attention_core[a:b].sum())

    def largest_attention_core_bytes(self, a: int, b: int) -> float:
        assert self.attention_core is not None
        return float(self.attention_core[a:b].max())

    def core_forward_seconds(self, a: int, b: int) -> float:
        """Forward seconds of the attention cores of layers [a, b) (their FLOPs' share)."""
        assert self.core_forward is not None
        return float(self.core_forward[b] - self.core_forward[a])


def in_flight_micro_batches(stage: int, num_stages: int, num_micro_batches: int) -> int:
    """Micro-batches whose activations stage `stage` holds at its peak under 1F1B."""
    return min(num_stages - stage, num_micro_batches)


def one_f_one_b_seconds(
    stage_seconds: Sequence[float],
    boundary_seconds: Sequence[float],
    num_micro_batches: int,
    *,
    blocking_p2p: bool = False,
) -> float:
    """Forward/backward time of one iteration of a 1F1B pipeline with heterogeneous stages.

    stage_seconds[i] = forward + backward of one micro-batch on stage i (its slowest
    replica); boundary_seconds[k] = time to move one activation between stage k and k+1
    (the gradient going back has the same size and link). The first micro-batch crosses
    every stage and boundary forward and back (warm-up plus cool-down); the other M - 1
    leave at the pace of the slowest stage's cycle, which includes the activation it sends
    on and the gradient it sends back:

        T = sum_i t_i + 2 * sum_k x_k + (M - 1) * max_i (t_i + c (x_{i-1} + x_i))

    with c = 1 when each send is paired with the receive of the other direction and c = 2
    when every send and receive is its own blocking call (SimulatorConstants.blocking_p2p).
    For equal stages without communication this is the textbook (M + P - 1)(f + b).
    """
    num_stages = len(stage_seconds)
    per_cycle = 2.0 if blocking_p2p else 1.0
    cycle = 0.0
    for i, t in enumerate(stage_seconds):
        incoming = boundary_seconds[i - 1] if i > 0 else 0.0
        outgoing = boundary_seconds[i] if i < num_stages - 1 else 0.0
        cycle = max(cycle, t + per_cycle * (incoming + outgoing))
    fill_drain = sum(stage_seconds) + 2.0 * sum(boundary_seconds[: num_stages - 1])
    return fill_drain + (num_micro_batches - 1) * cycle


def transfer_seconds_array(curve: BandwidthCurve, nbytes: FloatArray) -> FloatArray:
    """BandwidthCurve.transfer_seconds over an array of message sizes (0 where size <= 0)."""
    sizes = np.asarray(nbytes, dtype=np.float64)
    positive = sizes > 0
    safe = np.where(positive, sizes, 1.0)
    x = np.log2(safe / 1e6)
    knee = curve.small_message_knee  # below it the time stays the knee's (BandwidthCurve)
    fit = np.maximum(x, knee)
    c0, c1, c2 = curve.coefficients
    gbps = (c0 * fit * fit + c1 * fit + c2) * np.exp2(np.minimum(x - knee, 0.0))
    rate = np.clip(gbps * 1e9, curve.min_bytes_per_s, curve.max_bytes_per_s)
    seconds: FloatArray = np.where(positive, curve.latency_s + safe / rate, 0.0)
    return seconds


def flat_curve(bytes_per_s: float) -> BandwidthCurve:
    """A link that runs at one rate whatever the message size (a datasheet figure)."""
    return BandwidthCurve(
        coefficients=(0.0, 0.0, bytes_per_s / 1e9),
        max_bytes_per_s=bytes_per_s,
        min_bytes_per_s=min(1e6, bytes_per_s),
    )


def scaled_curve(curve: BandwidthCurve, factor: float) -> BandwidthCurve:
    """`curve` with every rate multiplied by `factor` (a share of a NIC, another shape)."""
    if factor == 1.0:
        return curve
    c0, c1, c2 = curve.coefficients
    return BandwidthCurve(
        coefficients=(c0 * factor, c1 * factor, c2 * factor),
        max_bytes_per_s=curve.max_bytes_per_s * factor,
        min_bytes_per_s=curve.min_bytes_per_s * factor,
        latency_s=curve.latency_s,
    )


@dataclass(frozen=True)
class ZoneLink:
    """The curve a link between two zones is priced from, and what it rests on.

    key: the zone pair's store key (profiles.types.zone_pair_key); source: measured when the
    pair's own curve for that direction was measured; how: which curve stood in otherwise
    (the class curve measured elsewhere, the median of the class's measured zone pairs, or
    the catalog's estimate), as `sailplan simulate` names it.
    """

    curve: BandwidthCurve
    key: str
    source: Source
    how: str


class CostModel:
    """Cost tables and cached link/price lookups for one PlanningContext."""

    def __init__(self, context: PlanningContext) -> None:
        self.context = context
        self.model = context.model
        self.constants = context.constants
        self.num_layers = context.model.num_layers
        self.training = context.training
        self._largest_tensor: dict[int, float] = {}
        self._copy_matrices: dict[int, FloatArray] = {}
        self._tables: dict[tuple[str, int, int], StageTable | None] = {}
        self._curves: dict[tuple[LinkClass, str, str, int], BandwidthCurve] = {}
        self._pools = {p.name: p for p in context.cluster.pools}
        self._prices: dict[str, float] = {}
        self._egress: dict[tuple[str, str], float] = {}
        self._memory: dict[str, float] = {}
        self._p2p: dict[tuple[str, str, str, str, str, str, int, bool, float, int], float] = {}
        self._shape_profiles: dict[tuple[LinkClass, str, int, Measure], NetworkProfile | None] = {}
        self._zone_links: dict[tuple[str, str, str, str, int], ZoneLink] = {}
        self._watts: dict[str, tuple[float, float]] = {}
        self._energy_model: EnergyModel | None = None

    # -- compute -------------------------------------------------------------------------

    def table(self, gpu_type: str, tp: int, mbs: int) -> StageTable | None:
        """The prefix tables of a grid point, or None when it has no profile or does not fit."""
        key = (gpu_type, tp, mbs)
        if key not in self._tables:
            self._tables[key] = self._build_table(gpu_type, tp, mbs)
        return self._tables[key]

    def require_table(self, gpu_type: str, tp: int, mbs: int) -> StageTable:
        table = self.table(gpu_type, tp, mbs)
        if table is None:
            available = self.context.profiles.compute_grid(self.model.name, gpu_type)
            raise MissingProfileError(
                f"no usable compute profile for {self.model.name} on {gpu_type} at TP={tp}, "
                f"micro-batch {mbs}; available (tp, mbs): {available or 'none'}"
            )
        return table

    def _build_table(self, gpu_type: str, tp: int, mbs: int) -> StageTable | None:
        profile = self.context.profiles.compute_profile(self.model.name, gpu_type, tp, mbs)
        if profile is None or profile.oom or len(profile.forward_s) != self.num_layers:
            return None
        flash = self.constants.flash_attention
        layer_activations = np.array(
            [
                layer_activation_bytes(self.model, i, tp, mbs, flash)
                * self.training.activation_scale
                for i in range(self.num_layers)
            ]
        )

        scale = self.training.activation_scale
        cores = [
            attention_core_bytes(self.model, i, tp, mbs) * scale if not flash else 0.0
            for i in range(self.num_layers)
        ]
        shares = [attention_core_share(self.model, i, tp, mbs) for i in range(self.num_layers)]

        def prefix(values: Sequence[float]) -> FloatArray:
            out = np.zeros(self.num_layers + 1, dtype=np.float64)
            np.cumsum(np.asarray(values, dtype=np.float64), out=out[1:])
            return out

        return StageTable(
            gpu_type=gpu_type,
            tensor_parallel=tp,
            micro_batch_size=mbs,
            forward=prefix(profile.forward_s),
            backward=prefix(profile.backward_s),
            update=prefix(profile.update_s),
            params=prefix([self.model.layer_parameters(i, tp) for i in range(self.num_layers)]),
            activations=prefix(layer_activations.tolist()),
            # the head's output is the loss, a scalar
            kept_outputs=prefix(
                [
                    float(self.boundary_bytes(mbs, i + 1)) if i + 1 < self.num_layers else 0.0
                    for i in range(self.num_layers)
                ]
            ),
            layer_activations=layer_activations,
            attention_core=np.array(cores, dtype=np.float64),
            core_forward=prefix([f * c for f, c in zip(profile.forward_s, shares, strict=True)]),
            copies=self._copies(tp),
        )

    def _copies(self, tp: int) -> FloatArray | None:
        """The shared-parameter copies per layer range (None for a model without any)."""
        if not shared_users(self.model):
            return None
        cached = self._copy_matrices.get(tp)
        if cached is None:
            cached = copy_parameter_matrix(self.model, tp)
            self._copy_matrices[tp] = cached
        return cached

    def boundary_bytes(self, mbs: int, layer: int) -> int:
        """Bytes of one activation (or its gradient) crossing the stage boundary before
        `layer` (an encoder-decoder's decoder side carries the encoder output too)."""
        # profiles.memory counts 16-bit elements; the training setup says what is sent
        elements = boundary_activation_bytes(self.model, mbs, layer) // ACTIVATION_BYTES
        return elements * self.training.boundary_element_bytes

    def largest_tensor(self, tp: int) -> float:
        """Elements of the largest parameter tensor of a TP rank (embedding or head, an MLP
        or the fused QKV projection): ZeRO-2 may hold that many unreduced gradients."""
        cached = self._largest_tensor.get(tp)
        if cached is None:
            m = self.model
            widest = max(m.vocab_size, m.ffn_size * (2 if m.mlp == "swiglu" else 1))
            cached = float(max(widest, 3 * m.hidden_size) * m.hidden_size / tp)
            self._largest_tensor[tp] = cached
        return cached

    def model_states(
        self, params: Bytes, data_parallel: int, tp: int, offload: bool = False
    ) -> ModelStateBytes:
        """Model-state terms of one GPU holding `params` parameters (simulator/memory.py)."""
        training = self.training
        if offload and training.zero_stage == 0:
            # DeepSpeed's optimizer offload is part of its ZeRO optimizer: the trainer runs
            # an offloaded stage under ZeRO-1 (sailplan.trainer.optimizer.make_optimizer)
            training = replace(training, zero_stage=1)
        return model_state_bytes(
            params,
            data_parallel,
            training,
            self.context.optimizer,
            self.largest_tensor(tp),
            offload=offload,
        )

    def model_state_bytes(
        self, params: Bytes, data_parallel: int, tp: int, offload: bool = False
    ) -> Bytes:
        """Sum of the model-state terms; `params` may be a numpy array (the search's tables)."""
        return self.model_states(params, data_parallel, tp, offload).total

    def offload_seconds(self, gpu_type: str, params: Bytes, data_parallel: int) -> Bytes:
        """The optimizer step of an offloaded stage replica (one TP rank, `params` on it):
        its fp32 gradient partition device -> host, DeepSpeedCPUAdam on the host, the
        updated partition host -> device, each copy at the GPU's host link (catalog
        host_link_bytes_per_s, one direction) and the update at
        SimulatorConstants.cpu_adam_params_per_s. It replaces the GPU's update."""
        spec = self.context.catalog.gpu(gpu_type)
        link = spec.host_link_bytes_per_s
        if link is None:
            raise MissingProfileError(
                f"{gpu_type} has no host_link_bytes_per_s in the catalog: optimizer offload "
                "cannot be priced there"
            )
        share = params / max(1, data_parallel)
        moved = (4 + self.training.parameter_bytes) * share
        return moved / link + share / self.constants.cpu_adam_params_per_s

    def stage_seconds(self, table: StageTable, a: int, b: int, recompute: str = "none") -> float:
        """Forward + backward of one micro-batch on layers [a, b); full recomputation runs
        every forward again inside the backward (forward + forward + backward), selective
        recomputation the attention cores' forwards only (profiles/selective.py)."""
        seconds = table.forward_backward_seconds(a, b)
        if recompute == "full":
            return seconds + table.forward_seconds(a, b)
        if recompute == "selective":
            return seconds + table.core_forward_seconds(a, b)
        return seconds

    def stage_update_seconds(
        self, table: StageTable, a: int, b: int, offload: bool, data_parallel: int
    ) -> float:
        """The optimizer step of layers [a, b): on the GPU (the profile), or offloaded.

        The optimizer also updates the copies of shared parameters the stage keeps
        (simulator/ties.py), which no layer's profiled update includes: priced at the
        profiled update time per parameter of layer 0, the token matrix's owner. (The
        search's matrices leave it out, a lower bound there.)"""
        if offload:
            return float(
                self.offload_seconds(table.gpu_type, table.parameters(a, b), data_parallel)
            )
        seconds = table.update_seconds(a, b)
        copies = float(table.copies[a, b]) if table.copies is not None else 0.0
        first = float(table.params[1] - table.params[0])
        if copies > 0 and first > 0:
            seconds += table.update_seconds(0, 1) * copies / first
        return seconds

    def stage_host_bytes(self, table: StageTable, a: int, b: int, data_parallel: int) -> float:
        """Host memory one GPU's rank of an offloaded stage holds (simulator/memory.py)."""
        states = self.model_states(
            table.parameters(a, b), data_parallel, table.tensor_parallel, offload=True
        )
        return float(states.host)

    def host_memory_bytes(self, gpu_type: str) -> float | None:
        """Host memory per GPU of the type's nodes, where the catalog knows it: of the
        machine shape of each of the cluster's pools of the type (by GPUs per node), the
        least, since a stage's replicas may land on any of them."""
        catalog = self.context.catalog
        spec = catalog.gpu(gpu_type)
        counts = {
            pool.gpus_per_node
            for pool in self.context.cluster.pools
            if catalog.gpu(pool.gpu_type).name == spec.name
        }
        per_gpu = (
            [spec.host_memory_gib_per_gpu_of(n) for n in sorted(counts)]
            if counts
            else [spec.host_memory_gib_per_gpu_of(None)]
        )
        known = [gib for gib in per_gpu if gib is not None]
        return min(known) * 2**30 if known else None

    def stage_memory_bytes(
        self,
        table: StageTable,
        a: int,
        b: int,
        *,
        stage: int,
        num_stages: int,
        num_micro_batches: int,
        data_parallel: int = 1,
        recompute: str = "none",
        offload: bool = False,
    ) -> float:
        """Peak memory of one GPU of a stage replica holding layers [a, b).

        Model states (weights, gradients, master weights, optimizer states, reduce buckets,
        shared over `data_parallel` replicas under ZeRO: simulator/memory.py; under
        `offload` the optimizer's share is in host memory) + the activations of the
        micro-batches 1F1B keeps in flight (each with its received input when the stage is
        not the first) + the framework's fixed overhead. With full recomputation
        (`recompute="full"`) a micro-batch keeps only its layers' outputs (Korthikanti et
        al. 2022, Sec. 4.1: 2sbh bytes per layer at 16 bits) and the backward holds one
        layer's activations again while it recomputes it, the stage's largest. With
        selective recomputation (`recompute="selective"`) a micro-batch keeps everything but
        the attention cores' 5as^2b/t per layer (Korthikanti Table 2: sbh(10 + 24/t) per
        layer; profiles/selective.py) and the backward holds one layer's core again.
        """
        in_flight = in_flight_micro_batches(stage, num_stages, num_micro_batches)
        recomputed = 0.0
        if recompute == "full":
            activations = table.recompute_kept_bytes(a, b)
            recomputed = table.largest_layer_activation_bytes(a, b)
        elif recompute == "selective":
            activations = table.activation_bytes(a, b) - table.attention_core_bytes(a, b)
            recomputed = table.largest_attention_core_bytes(a, b)
        else:
            activations = table.activation_bytes(a, b)
        if a > 0:
            activations += self.boundary_bytes(table.micro_batch_size, a)
        return (
            float(
                self.model_state_bytes(
                    table.parameters(a, b), data_parallel, table.tensor_parallel, offload
                )
            )
            + (activations * in_flight + recomputed) * self.constants.activation_allocator_factor
            + self.constants.framework_overhead_bytes
        )

    def gradient_bytes(self, table: StageTable, a: int, b: int) -> float:
        """Gradient bytes one TP group all-reduces for layers [a, b) (all its ranks together)."""
        return table.parameters(a, b) * table.tensor_parallel * self.training.gradient_bytes

    def gpu_memory_bytes(self, gpu_type: str) -> float:
        cached = self._memory.get(gpu_type)
        if cached is None:
            cached = float(self.context.catalog.gpu(gpu_type).memory_bytes)
            self._memory[gpu_type] = cached
        return cached

    # -- network -------------------------------------------------------------------------

    def link_class(self, a: EndpointLike, b: EndpointLike, same_node: bool = False) -> LinkClass:
        """Which measured link two workers talk over.

        Two workers of a plan are separate Pods that the scheduler may put on different
        nodes, so unless the caller knows better they talk across nodes.
        """
        if same_node:
            return "intra-node"
        if a.zone == b.zone:
            return "intra-zone"
        if region_of(a.zone) == region_of(b.zone):
            return "inter-zone"
        return "inter-region"

    def gpus_per_node(self, endpoint: EndpointLike) -> int:
        pool = self._pools.get(endpoint.pool)
        return pool.gpus_per_node if pool is not None else 1

    def curve(self, link: LinkClass, gpu_a: str, gpu_b: str, gpus_per_node: int) -> BandwidthCurve:
        key = (link, gpu_a, gpu_b, gpus_per_node)
        curve = self._curves.get(key)
        if curve is None:
            profile = self.context.profiles.network_profile(link, gpu_a, gpu_b, gpus_per_node)
            if profile is not None:
                curve = profile.curve
            else:
                from sailplan.planner.profiles.estimate import default_network_curve

                curve = default_network_curve(
                    self.context.catalog, link, gpu_a, gpu_b, gpus_per_node
                )
            self._curves[key] = curve
        return curve

    def _group_curve(
        self, a: EndpointLike, b: EndpointLike, tp: int, same_node: bool
    ) -> BandwidthCurve:
        # A TP group on one node uses that node's links: the curve measured with that many
        # GPUs per VM (Sailor's convention: min(TP, GPUs per node)).
        gpus = self.zone_link_gpus(a, b, tp)
        link = self.link_class(a, b, same_node)
        if link in {"inter-zone", "inter-region"}:
            return self.zone_link(a, b, gpus).curve
        return self.curve(link, a.gpu_type, b.gpu_type, gpus)

    def zone_link(self, a: EndpointLike, b: EndpointLike, gpus_per_node: int) -> ZoneLink:
        """The link from a's zone to b's (different zones), for nodes of `gpus_per_node` GPUs.

        The pair's own curve when the profile store measured that direction between those
        zones and GPU types (the nearest node shape measured, as network_profile picks);
        else the link class stands in, and the ZoneLink says how: a curve measured for the
        whole class (an older store, a Sailor class median); else the median, by the rate of
        a 64 MB message, of the class's measured zone pairs of these GPU types (the rule the
        Sailor importer's class medians follow); else the class's estimate (catalog).
        """
        cache = (a.zone, a.gpu_type, b.zone, b.gpu_type, gpus_per_node)
        found = self._zone_links.get(cache)
        if found is not None:
            return found
        profiles = self.context.profiles
        link = self.link_class(a, b)
        key = zone_pair_key(link, a.zone, a.gpu_type, b.zone, b.gpu_type, gpus_per_node)
        pair = profiles.zone_pair_profile(a.zone, a.gpu_type, b.zone, b.gpu_type, gpus_per_node)
        if pair is not None and pair.provenance.source == "measured":
            version = pair.provenance.date or pair.provenance.tool_version
            found = ZoneLink(pair.curve, key, "measured", version)
        else:
            whole = profiles.network_profile(link, a.gpu_type, b.gpu_type, gpus_per_node)
            others = profiles.zone_pair_profiles(link, a.gpu_type, b.gpu_type)
            same_shape = [p for p in others if p.gpus_per_node == gpus_per_node]
            others = tuple(same_shape) or others
            if whole is not None and whole.provenance.source == "measured":
                how = f"the {link} class curve {whole.key} (measured)"
                found = ZoneLink(whole.curve, key, "estimated", how)
            elif others:
                ranked = sorted(
                    others, key=lambda p: (p.curve.bytes_per_second(64e6), p.curve.coefficients)
                )
                median = ranked[(len(ranked) - 1) // 2].curve
                how = f"the median of {len(ranked)} measured {link} zone pairs"
                found = ZoneLink(median, key, "estimated", how)
            else:
                curve = self.curve(link, a.gpu_type, b.gpu_type, gpus_per_node)
                found = ZoneLink(curve, key, "estimated", f"the {link} class estimate (catalog)")
        self._zone_links[cache] = found
        return found

    def zone_link_gpus(self, a: EndpointLike, b: EndpointLike, tp: int) -> int:
        """The node shape a pipeline send between a and b is priced at (_group_curve's)."""
        return max(1, min(tp, self.gpus_per_node(a), self.gpus_per_node(b)))

    def shape_profile(
        self, link: LinkClass, gpu_type: str, gpus_per_node: int, measure: Measure
    ) -> NetworkProfile | None:
        """The measured `measure` profile between nodes of one GPU type and exactly this
        shape (a node's collective or aggregate rate does not carry over to another shape)."""
        key = (link, gpu_type, gpus_per_node, measure)
        if key not in self._shape_profiles:
            found = self.context.profiles.network_profile(
                link, gpu_type, gpu_type, gpus_per_node, measure=measure
            )
            usable = (
                found is not None
                and found.provenance.source == "measured"
                and found.gpus_per_node == gpus_per_node
                and found.gpu_type == gpu_type
                and found.peer_gpu_type in {gpu_type, ""}
            )
            self._shape_profiles[key] = found if usable else None
        return self._shape_profiles[key]

    def node_nic_curve(self, gpu_type: str, gpus_per_node: int) -> BandwidthCurve:
        """What one node of `gpus_per_node` GPUs sends to another node of its zone.

        The node's aggregate rate measured with all its GPUs sending at once (`concurrent`)
        between VMs of exactly that shape when there is one; else the single flow measured
        between VMs of that shape; else one measured on another shape of the same GPU,
        scaled by the ratio of the two shapes' documented egress caps (catalog
        vm_egress_bytes_per_s); else the documented cap itself (estimated).
        """
        key: tuple[LinkClass, str, str, int] = ("intra-zone", gpu_type, "nic", gpus_per_node)
        curve = self._curves.get(key)
        if curve is None:
            spec = self.context.catalog.gpu(gpu_type)
            cap = spec.node_egress_bytes_per_s(gpus_per_node)
            profile = self.context.profiles.network_profile(
                "intra-zone", gpu_type, gpu_type, gpus_per_node
            )
            concurrent = self.shape_profile("intra-zone", gpu_type, gpus_per_node, "concurrent")
            if concurrent is not None:
                curve = concurrent.curve
            elif profile is not None and profile.provenance.source == "measured":
                measured_on = profile.gpus_per_node or gpus_per_node
                scale = cap / spec.node_egress_bytes_per_s(measured_on)
                curve = scaled_curve(profile.curve, scale)
            else:
                curve = flat_curve(cap)
            self._curves[key] = curve
        return curve

    def measured_pair_curve(self, a: EndpointLike, b: EndpointLike) -> BandwidthCurve | None:
        """The link measured between nodes of two different GPU types in one zone (the
        slower node of a mixed pair may not be the whole story: the pair was measured), for
        the sender's node shape; None for one GPU type or nothing measured."""
        if a.gpu_type == b.gpu_type:
            return None
        gpn = self.gpus_per_node(a)
        profile = self.context.profiles.network_profile("intra-zone", a.gpu_type, b.gpu_type, gpn)
        if profile is None or profile.provenance.source != "measured":
            return None
        if {profile.gpu_type, profile.peer_gpu_type} != {a.gpu_type, b.gpu_type}:
            return None  # a generic or one-sided profile, not this pair
        return profile.curve

    def _intra_node_link(self, gpu_type: str, gpus_per_node: int) -> tuple[BandwidthCurve, float]:
        """Per-GPU link inside a node (measured curve or datasheet) and its hop latency."""
        curve = self.curve("intra-node", gpu_type, gpu_type, gpus_per_node)
        link = self.context.catalog.gpu(gpu_type).intra_node_link
        latency = NVLINK_HOP_LATENCY_S if link.startswith("nvlink") else PCIE_HOP_LATENCY_S
        return curve, latency

    def p2p_seconds(
        self,
        nbytes: float,
        a: EndpointLike,
        b: EndpointLike,
        tp: int = 1,
        *,
        same_node: bool = False,
        flows: int = 1,
    ) -> float:
        """Time to send `nbytes` (what the whole TP group sends) from worker a to worker b.

        Latency + size / bandwidth on the link that carries it: the node's NVLink/PCIe when
        both are on one node; else the sender's and receiver's NICs, each group getting the
        share of its node's NIC its GPUs are of the node (the node's other GPUs send at the
        same time), the slower of the two; across zones or regions the link between the two
        zones (zone_link) when that is slower still, in either direction (a pipeline
        boundary carries the activation one way and its gradient the other at once). Across nodes the
        bytes go as `flows` parallel flows, so each curve is read at nbytes / flows.
        """
        if nbytes <= 0:
            return 0.0
        key = (a.pool, a.gpu_type, a.zone, b.pool, b.gpu_type, b.zone, tp, same_node, nbytes, flows)
        seconds = self._p2p.get(key)
        if seconds is None:
            if same_node:
                curve, latency = self._intra_node_link(a.gpu_type, self.gpus_per_node(a))
                rate = curve.bytes_per_second(nbytes / max(1, tp))
            else:
                rates = []
                message = nbytes / max(1, flows)
                for end in (a, b):
                    gpn = self.gpus_per_node(end)
                    share = self._nic_share(tp, gpn, flows)
                    rates.append(
                        self.node_nic_curve(end.gpu_type, gpn).bytes_per_second(message) * share
                    )
                link = self.link_class(a, b)
                if link != "intra-zone":
                    # each 1F1B cycle sends the activation a -> b while the gradient comes
                    # back b -> a: the slower direction between the zones paces the boundary
                    for ends in ((a, b), (b, a)):
                        rates.append(self._group_curve(*ends, tp, False).bytes_per_second(message))
                else:
                    pair = self.measured_pair_curve(a, b)
                    if pair is not None:
                        share = self._nic_share(tp, self.gpus_per_node(a), flows)
                        rates.append(pair.bytes_per_second(message) * share)
                rate = min(rates)
                latency = NETWORK_HOP_LATENCY_S
            seconds = latency + nbytes / rate
            self._p2p[key] = seconds
        return seconds

    @staticmethod
    def _nic_share(tp: int, gpus_per_node: int, flows: int = 1) -> float:
        """How many nodes' NICs a TP group's traffic has: its GPUs' share of its node's NIC
        (the node's other GPUs send at the same time), or, for a group spread over several
        nodes (an imported plan's TP 4 over 1-GPU machines), one NIC per node when its
        flows leave from all of them (one flow leaves from one node)."""
        tp = max(1, tp)
        if tp <= gpus_per_node:
            return tp / gpus_per_node
        return float(min(-(-tp // gpus_per_node), max(1, flows)))

    def boundary_seconds(
        self,
        nbytes: float,
        a: EndpointLike,
        b: EndpointLike,
        tp_sender: int = 1,
        tp_receiver: int = 1,
    ) -> float:
        """Time to move one boundary tensor of `nbytes` (one copy of the activation or its
        gradient) from a stage replica to the next one, as the runtime really moves it.

        Every TP rank of the sender holds the whole tensor after its last row-parallel
        all-reduce, yet neither runtime sends it once per rank:
        - Sailplan's trainer (trainer/schedule.py): TP rank 0 sends it whole, in one flow,
          to TP rank 0 of the receiver, which broadcasts it over its node's link to its
          other TP ranks (a pipelined broadcast moves the bytes once per link);
        - DeepSpeed's PipelineEngine (SimulatorConstants.partitioned_p2p, pipe_partitioned
          and grad_partitioned as the Sailor runs had them): each of the TP ranks sends its
          1/TP partition to its peer at once and the receiver all-gathers the parts inside
          its node, (TP - 1) / TP x the bytes per GPU.
        Either way the group's share of its nodes' NICs carries one copy (p2p_seconds with
        the bytes the group moves), plus the receiver's step inside its node.
        """
        if nbytes <= 0:
            return 0.0
        tp = max(1, min(tp_sender, tp_receiver))
        partitioned = self.constants.partitioned_p2p and tp > 1
        seconds = self.p2p_seconds(nbytes, a, b, tp, flows=tp if partitioned else 1)
        if tp_receiver > 1:
            curve, latency = self._intra_node_link(b.gpu_type, self.gpus_per_node(b))
            if partitioned:
                part = nbytes / tp_receiver
                moved = (tp_receiver - 1) * part
                seconds += moved / curve.bytes_per_second(part)
            else:
                seconds += nbytes / curve.bytes_per_second(nbytes)
            seconds += (tp_receiver - 1) * latency
        return seconds

    @staticmethod
    def ring_order(replicas: Sequence[E]) -> list[E]:
        """The ring NCCL would build: grouped by zone then pool, so each zone is entered once."""
        return sorted(replicas, key=lambda r: (region_of(r.zone), r.zone, r.pool, r.gpu_type))

    @staticmethod
    def ring_zone_edges(ring: Sequence[E]) -> list[tuple[E, E]]:
        """The zone-crossing edges of a ring (ring_order's): from the first replica of each
        zone to the first of the next, the last zone back to the first; none in one zone."""
        zones = [r for i, r in enumerate(ring) if i == 0 or r.zone != ring[i - 1].zone]
        if len(zones) < 2:
            return []
        return [(a, zones[(i + 1) % len(zones)]) for i, a in enumerate(zones)]

    def allreduce_layout(self, replicas: Sequence[EndpointLike], tp: int = 1) -> AllReduceLayout:
        """Where a stage's data-parallel group runs (see collectives.AllReduceLayout).

        Replicas of one pool fill its nodes in order, GPUs-per-node // TP replicas to a node
        (the pods of a pool are packed, TP groups never straddle a node). The per-node rate
        across nodes is the slowest of: each node's NIC times the share of the node the
        group's GPUs are (the rest of the node reduces its own stage at the same time), and
        every zone-crossing edge of the ring. Inside nodes: the slowest node's per-GPU link.
        """
        ring = self.ring_order(replicas)
        by_pool: dict[str, list[EndpointLike]] = {}
        for replica in ring:
            by_pool.setdefault(replica.pool, []).append(replica)
        ranks_per_node, nodes = 1, 0
        intra: list[tuple[BandwidthCurve, float]] = []
        intra_busbw: list[BandwidthCurve | None] = []
        inter: list[BandwidthCurve] = []
        for members in by_pool.values():
            first = members[0]
            gpn = self.gpus_per_node(first)
            per_node = max(1, gpn // max(1, tp))
            on_busiest = min(per_node, len(members))
            nodes += math.ceil(len(members) / per_node)
            ranks_per_node = max(ranks_per_node, on_busiest)
            if on_busiest > 1:
                intra.append(self._intra_node_link(first.gpu_type, gpn))
                bus = self.shape_profile("intra-node", first.gpu_type, gpn, "allreduce")
                intra_busbw.append(bus.curve if bus is not None else None)
            # every TP rank runs its own DP communicator, so a group spread over several
            # nodes reduces through all their NICs at once
            share = (
                min(1.0, on_busiest * tp / gpn) if tp <= gpn else self._nic_share(tp, gpn, flows=tp)
            )
            inter.append(scaled_curve(self.node_nic_curve(first.gpu_type, gpn), share))
        pools = [r for i, r in enumerate(ring) if i == 0 or r.pool != ring[i - 1].pool]
        for i, a in enumerate(pools):
            b = pools[(i + 1) % len(pools)]
            pair = self.measured_pair_curve(a, b) if a.zone == b.zone else None
            if pair is not None:
                inter.append(pair)
        zones = [r for i, r in enumerate(ring) if i == 0 or r.zone != ring[i - 1].zone]
        for a, b in self.ring_zone_edges(ring):
            inter.append(self._group_curve(a, b, self.gpus_per_node(a), False))
        probe = 64e6
        slowest_inter = min(inter, key=lambda c: (c.bytes_per_second(probe), c.coefficients))
        if intra:
            intra_curve, intra_latency = min(
                intra, key=lambda x: (x[0].bytes_per_second(probe), x[0].coefficients)
            )
        else:
            intra_curve, intra_latency = flat_curve(1e12), NVLINK_HOP_LATENCY_S
        cross_zone = len(zones) > 1
        measured_intra = [c for c in intra_busbw if c is not None]
        return AllReduceLayout(
            ranks_per_node=ranks_per_node,
            nodes=nodes,
            intra_node=intra_curve,
            intra_hop_latency_s=intra_latency,
            inter_node=slowest_inter,
            inter_hop_latency_s=NETWORK_HOP_LATENCY_S
            + (max(c.latency_s for c in inter) if cross_zone else 0.0),
            intra_node_busbw=(
                min(measured_intra, key=lambda c: (c.bytes_per_second(probe), c.coefficients))
                if measured_intra and len(measured_intra) == len(intra_busbw)
                else None
            ),
            collective_busbw=self._measured_collective(ring) if nodes > 1 else None,
        )

    def _measured_collective(self, ring: Sequence[EndpointLike]) -> BandwidthCurve | None:
        """The all-reduce measured across nodes of the group's one GPU type and node shape in
        its one zone; None for a mixed or multi-zone group (measured on neither)."""
        shapes = {(r.gpu_type, self.gpus_per_node(r), r.zone) for r in ring}
        if len(shapes) != 1:
            return None
        ((gpu_type, gpn, _),) = shapes
        found = self.shape_profile("intra-zone", gpu_type, gpn, "allreduce")
        return found.curve if found is not None else None

    def allreduce_inputs(
        self, replicas: Sequence[EndpointLike], tp: int = 1
    ) -> dict[str, tuple[Source, str]]:
        """Which network inputs a stage's all-reduce rests on, measured or estimated, by
        profile-store key (network/<link>/<gpu>/<gpu>/n<G>, the key a profiling Job of that
        GPU type and node shape fills): the node's all-reduce inside it when replicas share
        a node; across nodes the measured collective, else the node NIC it was priced from."""
        if len(replicas) <= 1:
            return {}
        layout = self.allreduce_layout(replicas, tp)
        inputs: dict[str, tuple[Source, str]] = {}
        for replica in replicas:
            gpu, gpn = replica.gpu_type, self.gpus_per_node(replica)
            if layout.ranks_per_node > 1 and gpn > 1:
                key = f"network/intra-node/{gpu}/{gpu}/n{gpn}"
                inputs[key] = self._shape_source("intra-node", gpu, gpn, ("allreduce",))
                if inputs[key][0] == "estimated":
                    # the physics' per-GPU link: measured when a p2p curve was
                    inputs[key] = self._flow_source("intra-node", gpu, gpn)
            if layout.nodes > 1:
                inputs.update(self.nic_inputs(replica))
        if layout.collective_busbw is not None:
            gpu, gpn = replicas[0].gpu_type, self.gpus_per_node(replicas[0])
            key = f"network/intra-zone/{gpu}/{gpu}/n{gpn}"
            inputs[key] = self._shape_source("intra-zone", gpu, gpn, ("allreduce",))
        return inputs

    def nic_inputs(self, endpoint: EndpointLike) -> dict[str, tuple[Source, str]]:
        """The node NIC an endpoint's traffic across nodes is priced from (node_nic_curve):
        measured when its node shape's concurrent flows were, or when a single flow was (the
        curve node_nic_curve scales), else estimated from the catalog's egress cap."""
        gpu, gpn = endpoint.gpu_type, self.gpus_per_node(endpoint)
        key = f"network/intra-zone/{gpu}/{gpu}/n{gpn}"
        source = self._shape_source("intra-zone", gpu, gpn, ("concurrent",))
        return {
            key: source if source[0] == "measured" else self._flow_source("intra-zone", gpu, gpn)
        }

    def _flow_source(
        self, link: LinkClass, gpu_type: str, gpus_per_node: int
    ) -> tuple[Source, str]:
        """Measured when the p2p curve the physics uses for this link and shape was."""
        flow = self.context.profiles.network_profile(link, gpu_type, gpu_type, gpus_per_node)
        if flow is not None and flow.provenance.source == "measured":
            return "measured", flow.provenance.date or flow.provenance.tool_version
        return "estimated", "catalog"

    def _shape_source(
        self, link: LinkClass, gpu_type: str, gpus_per_node: int, measures: tuple[Measure, ...]
    ) -> tuple[Source, str]:
        for measure in measures:
            found = self.shape_profile(link, gpu_type, gpus_per_node, measure)
            if found is not None:
                return "measured", found.provenance.date or found.provenance.tool_version
        return "estimated", "catalog"

    def allreduce_seconds(
        self, nbytes: float, replicas: Sequence[EndpointLike], tp: int = 1
    ) -> float:
        """Gradient all-reduce of `nbytes` (per TP group) across a stage's replicas."""
        if len(replicas) <= 1 or nbytes <= 0:
            return 0.0
        layout = self.allreduce_layout(replicas, tp)
        return float(self.allreduce_seconds_array(np.array([nbytes]), layout, tp)[0])

    def allreduce_seconds_array(
        self, nbytes: FloatArray, layout: AllReduceLayout, tp: int
    ) -> FloatArray:
        """allreduce_seconds for many gradient sizes at once on one layout (the search's form)."""
        return collective_allreduce_seconds(layout, nbytes, tp, self.group_bucket_bytes(tp))

    def group_bucket_bytes(self, tp: int) -> float:
        """Bytes of one all-reduce bucket of a TP group (every TP rank packs its own shard's
        gradients into buckets and runs its own data-parallel collective per bucket).

        - SimulatorConstants.bucket_elements > 0: a runtime counting its bucket in elements
          per rank (DeepSpeed's PipelineEngine, the Sailor runs);
        - else the Sailplan trainer when the context trains as it does
          (TrainingSetup.trainer): under ZeRO-0 sailplan.trainer.grads flattens buckets of
          DEFAULT_BUCKET_BYTES (25 MiB) per rank, under ZeRO-1/2 DeepSpeed's ZeRO optimizer
          reduces buckets of sailplan.trainer.zero.BUCKET_ELEMENTS (2**24) per rank;
        - else SimulatorConstants.bucket_bytes per TP group.
        """
        tp = max(1, tp)
        elements = self.constants.bucket_elements
        if elements > 0:
            return elements * self.training.gradient_bytes * tp
        setup = self.training
        if setup.zero_stage == 0 and setup.replicated_bucket_bytes > 0:
            return setup.replicated_bucket_bytes * tp
        if setup.zero_stage > 0 and setup.bucket_elements > 0:
            return setup.bucket_elements * self.training.gradient_bytes * tp
        return self.constants.bucket_bytes

    def allreduce_last_bucket_seconds(
        self, nbytes: float, replicas: Sequence[EndpointLike], tp: int = 1
    ) -> float:
        """The all-reduce of the last bucket alone (what overlapping cannot hide)."""
        if nbytes <= 0:
            return 0.0
        bucket = self.group_bucket_bytes(tp)
        last = nbytes - bucket * math.floor((nbytes - 1e-9) / bucket)
        return self.allreduce_seconds(last, replicas, tp)

    def shared_gradient_seconds(self, name: str, ends: Sequence[tuple[EndpointLike, int]]) -> float:
        """One pipeline's sum of a shared parameter's gradient over the stages that use it
        (simulator/ties.py), as sailplan.trainer.engine.sync_shared_gradients runs it.

        `ends`: (replica, TP degree) of each user stage of the pipeline, in stage order.
        The full gradient (the whole tensor at the gradient's element bytes) is
        1. gathered from its TP group onto TP rank 0 of each stage (dist.gather over the
           node's links: the root receives TP - 1 shards at the per-GPU link rate);
        2. all-reduced among those m roots: NCCL's ring, 2 (m - 1) steps of 1/m of it each
           over the ring's slowest edge (a pipeline boundary's link, p2p_seconds: the NICs,
           across zones the slower direction between them; both directions at once), plus
           NCCL's base latency; for two stages that is the whole tensor each way;
        3. broadcast back into each TP group over the node's links.
        Stages on different nodes, as the pipeline boundaries are priced (link_class).
        DeepSpeed's PipelineEngine (SimulatorConstants.partitioned_p2p, the runtime that flag
        stands for) has no gather or broadcast: its tied groups pair the same TP rank of
        each stage (deepspeed/runtime/pipe/module.py `_index_tied_modules`,
        `allreduce_tied_weight_gradients`), so every TP rank rings its own 1/TP shard at
        once, TP flows through the group's NIC share as its partitioned boundary sends.
        """
        m = len(ends)
        if m < 2:
            return 0.0
        full = float(shared_elements(self.model, name) * self.training.gradient_bytes)
        chunk = full / m
        if self.constants.partitioned_p2p:
            step = max(
                self.p2p_seconds(chunk, a, b, tp_a, flows=tp_a)
                for (a, tp_a), (b, _) in zip(ends, [*ends[1:], ends[0]], strict=True)
            )
            return 2 * (m - 1) * step + NCCL_BASE_LATENCY_S
        gather = broadcast = 0.0
        for replica, tp in ends:
            if tp > 1:
                curve, latency = self._intra_node_link(
                    replica.gpu_type, self.gpus_per_node(replica)
                )
                shard = full / tp
                gather = max(
                    gather, (tp - 1) * shard / curve.bytes_per_second(shard) + (tp - 1) * latency
                )
                broadcast = max(broadcast, full / curve.bytes_per_second(full) + (tp - 1) * latency)
        step = max(
            self.p2p_seconds(chunk, a, b, min(tp_a, tp_b))
            for (a, tp_a), (b, tp_b) in zip(ends, [*ends[1:], ends[0]], strict=True)
        )
        return gather + 2 * (m - 1) * step + NCCL_BASE_LATENCY_S + broadcast

    def shared_gradient_egress(
        self, name: str, ends: Sequence[EndpointLike]
    ) -> tuple[float, float]:
        """(bytes crossing zones, USD) of shared_gradient_seconds' ring: each ring edge
        carries 2 (m - 1) / m x the full gradient."""
        m = len(ends)
        if m < 2:
            return 0.0, 0.0
        full = float(shared_elements(self.model, name) * self.training.gradient_bytes)
        per_edge = 2.0 * (m - 1) / m * full
        crossing = usd = 0.0
        for a, b in zip(ends, [*ends[1:], ends[0]], strict=True):
            if a.zone != b.zone:
                crossing += per_edge
                usd += per_edge / 1e9 * self.egress_usd_per_gb(a.zone, b.zone)
        return crossing, usd

    def allreduce_egress(
        self, nbytes: float, replicas: Sequence[EndpointLike]
    ) -> tuple[float, float]:
        """(bytes crossing zones, USD) of one ring all-reduce of `nbytes` per TP group."""
        d = len(replicas)
        if d <= 1 or nbytes <= 0:
            return 0.0, 0.0
        ring = self.ring_order(replicas)
        per_link = 2.0 * (d - 1) / d * nbytes
        crossing = 0.0
        usd = 0.0
        for i in range(d):
            a, b = ring[i], ring[(i + 1) % d]
            if a.zone != b.zone:
                crossing += per_link
                usd += per_link / 1e9 * self.egress_usd_per_gb(a.zone, b.zone)
        return crossing, usd

    # -- prices --------------------------------------------------------------------------

    def price_per_gpu_hour(self, pool: str) -> float:
        """The pool's override, else the catalog's price for its GPU type, region and spot."""
        price = self._prices.get(pool)
        if price is None:
            spec = self._pools.get(pool)
            if spec is None:
                raise MissingProfileError(
                    f"the plan uses pool {pool!r}, which the cluster snapshot does not have "
                    f"(pools: {', '.join(sorted(self._pools)) or 'none'})"
                )
            if spec.usd_per_gpu_hour is not None:
                price = spec.usd_per_gpu_hour
            else:
                price = self.context.catalog.price_per_gpu_hour(
                    spec.gpu_type, spec.region, spec.spot
                )
            self._prices[pool] = price
        return price

    def usd_per_joule(self, pool: str) -> float:
        """The pool's energy price per joule (0.0 when its energy is not priced)."""
        self.price_per_gpu_hour(pool)  # the same error for a pool the snapshot lacks
        usd_per_kwh = self._pools[pool].usd_per_kwh
        return 0.0 if usd_per_kwh is None else usd_per_kwh / JOULES_PER_KWH

    def gpu_watts(self, gpu_type: str) -> tuple[float, float]:
        """(power computing at the default clock, power while blocked): planner/energy's
        model at the maximum clock, from the GPU type's PowerProfile where the profiles
        carry one (ProfileSet.power), else the catalog's power fields (TDP, blocking)."""
        watts = self._watts.get(gpu_type)
        if watts is None:
            from sailplan.planner.energy.power import EnergyError, EnergyModel

            try:
                if self._energy_model is None:
                    self._energy_model = EnergyModel(
                        self.context.catalog, self.context.profiles.power_profiles()
                    )
                curve = self._energy_model.curve(gpu_type)
            except EnergyError as error:
                raise MissingProfileError(
                    f"cannot price the energy of GPU type {gpu_type!r}: {error}; or leave its "
                    "pools' energy price unset"
                ) from None
            watts = self._watts[gpu_type] = (curve.load_watts[0], curve.blocking_watts)
        return watts

    def egress_usd_per_gb(self, zone_a: str, zone_b: str) -> float:
        key = (zone_a, zone_b)
        price = self._egress.get(key)
        if price is None:
            overrides = self.context.cluster.egress_usd_per_gb or {}
            override = overrides.get(zone_a, {}).get(zone_b)
            if override is None:
                override = overrides.get(zone_b, {}).get(zone_a)
            price = (
                override
                if override is not None
                else self.context.catalog.egress_usd_per_gb(zone_a, zone_b)
            )
            self._egress[key] = price
        return price
