"""The project's profile format: what a model costs on a GPU type, what a link carries.

Three kinds: ComputeProfile (a model on a GPU type), NetworkProfile (a link class) and
PowerProfile (a GPU type's power against SM clock, for the energy model, planner/energy).
Profiles are data, versioned and typed, and every one says where it came from: `measured`
(by `sailplan-profile`, or imported from a Sailor artifact, with tool, GPU, driver and date)
or `estimated` (the analytic roofline). The simulator consumes them; the profilers in the
trainer image produce them; the operator stores them in ConfigMaps; the Sailor importer
converts into them. Measured beats estimated wherever both exist (see ProfileSet).
"""

from __future__ import annotations

import itertools
import math
from functools import cached_property
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PROFILE_API_VERSION: Final = "sailplan.dev/v1alpha1"
# NetworkProfile documents that name the zones at their two ends (a zone-pair curve) are
# written as v1alpha2, so an operator that predates zone pairs reports them as one
# unreadable document (profilestore: never fatal) instead of mistaking one zone pair's curve
# for its whole link class; documents without zones stay v1alpha1, readable by both.
ZONE_PAIR_API_VERSION: Final = "sailplan.dev/v1alpha2"

Source = Literal["measured", "estimated"]
LinkClass = Literal["intra-node", "intra-zone", "inter-zone", "inter-region"]
LINK_CLASSES: tuple[LinkClass, ...] = ("intra-node", "intra-zone", "inter-zone", "inter-region")
# What a network curve measured (NetworkProfile.measure):
# - p2p: one flow, one rank to one rank (ping-pong or one way): bytes / time;
# - concurrent: every GPU of a node sending to its peer on the other node at once, the
#   curve being the node's aggregate rate (what a node's NIC carries when all its GPUs talk);
# - allreduce: an all-reduce over `ranks` ranks (every GPU of `gpus_per_node`-GPU nodes), the
#   curve being nccl-tests' bus bandwidth, 2 (ranks - 1) / ranks x bytes / time, against the
#   message size each rank reduces.
Measure = Literal["p2p", "concurrent", "allreduce"]
MEASURES: tuple[Measure, ...] = ("p2p", "concurrent", "allreduce")


class Provenance(BaseModel):
    """Where a profile came from, so a plan can say how much to trust it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Source
    tool: str = Field(description="sailplan-profile, sailor-import, roofline, ...")
    tool_version: str = ""
    gpu_name: str = ""
    driver: str = ""
    torch_version: str = ""
    date: str = ""
    note: str = ""


class ComputeProfile(BaseModel):
    """Per-layer times of one model on one GPU type at one TP degree and micro-batch size.

    Times are seconds for one micro-batch through the layer on one GPU of the TP group;
    `update_s` is the optimizer step for that layer's parameter shard. `oom` marks a grid
    point that did not fit (the lists are then empty).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_version: Literal["sailplan.dev/v1alpha1"] = PROFILE_API_VERSION
    kind: Literal["ComputeProfile"] = "ComputeProfile"
    model: str
    gpu_type: str
    tensor_parallel: int = Field(ge=1)
    micro_batch_size: int = Field(ge=1)
    forward_s: tuple[float, ...] = ()
    backward_s: tuple[float, ...] = ()
    update_s: tuple[float, ...] = ()
    peak_memory_bytes: tuple[int, ...] = Field(
        default=(), description="optional measured per-layer peak memory for one micro-batch"
    )
    oom: bool = False
    provenance: Provenance

    @model_validator(mode="after")
    def _same_lengths(self) -> ComputeProfile:
        lengths = {len(self.forward_s), len(self.backward_s), len(self.update_s)}
        if len(lengths) != 1:
            raise ValueError("forward_s, backward_s and update_s must have one entry per layer")
        if not self.oom and not self.forward_s:
            raise ValueError("a profile that is not out-of-memory needs per-layer times")
        return self

    @property
    def key(self) -> str:
        return f"compute/{self.model}/{self.gpu_type}/tp{self.tensor_parallel}/mbs{self.micro_batch_size}"


def _small_message_knee(c0: float, c1: float, c2: float) -> float:
    """log2(MB) below which a bandwidth fit would make smaller messages take longer.

    The transfer time 2^x / bw(x) grows with the message while ln 2 x bw(x) > bw'(x) (and
    bw > 0). A degree-2 fit in log2(MB) bends down at small messages, below what was
    measured, until that fails: a 10 KB message on the artifact's Titan-RTX VM fit would
    take 145x a 45 KB one (the fit reaches 0 and the lower clamp, 1 MB/s). A transfer never
    takes longer for fewer bytes, so below the largest point under 1 MB where it fails the
    time stays at that point's (a latency floor). -inf where the fit never fails there (flat
    or rising curves), and where it misbehaves at 1 MB itself (left as it is).
    """
    ln2 = math.log(2.0)

    def bandwidth(x: float) -> float:
        return c0 * x * x + c1 * x + c2

    def rising(x: float) -> bool:
        return bandwidth(x) > 0 and ln2 * bandwidth(x) - (2 * c0 * x + c1) > 0

    if not rising(0.0):
        return -math.inf
    roots: list[float] = []
    # ln2 bw(x) - bw'(x) = 0 and bw(x) = 0, each a quadratic (or lower) in x
    for a, b, c in ((ln2 * c0, ln2 * c1 - 2 * c0, ln2 * c2 - c1), (c0, c1, c2)):
        if a != 0:
            disc = b * b - 4 * a * c
            if disc >= 0:
                root = math.sqrt(disc)
                roots += [(-b - root) / (2 * a), (-b + root) / (2 * a)]
        elif b != 0:
            roots.append(-c / b)
    below = [r for r in roots if r < 0.0]
    knee = max(below, default=-math.inf)
    return knee if knee == -math.inf or bandwidth(knee) > 0 else -math.inf


class BandwidthCurve(BaseModel):
    """Achieved bandwidth against message size.

    bandwidth_GBps(x) = c0*x^2 + c1*x + c2 with x = log2(message MB), clamped to
    [min_bytes_per_s, max_bytes_per_s]; the Sailor artifact's fit, so imported curves keep
    their meaning. Below `small_message_knee` (where the fit would make a smaller message
    take longer) the transfer time stays at the knee's: the rate falls in proportion to the
    message. The lower clamp keeps a badly extrapolated fit from going to zero.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    coefficients: tuple[float, float, float]
    max_bytes_per_s: float = Field(gt=0)
    min_bytes_per_s: float = Field(default=1e6, gt=0)
    latency_s: float = Field(default=0.0, ge=0)

    @cached_property
    def small_message_knee(self) -> float:
        """log2(MB) below which the time is held (_small_message_knee); -inf for none."""
        return _small_message_knee(*self.coefficients)

    def bytes_per_second(self, message_bytes: float) -> float:
        if message_bytes <= 0:
            return self.max_bytes_per_s
        x = math.log2(message_bytes / 1e6)
        knee = self.small_message_knee
        fit = max(x, knee)
        c0, c1, c2 = self.coefficients
        gbps: float = (c0 * fit * fit + c1 * fit + c2) * math.pow(2.0, min(x - knee, 0.0))
        return min(max(gbps * 1e9, self.min_bytes_per_s), self.max_bytes_per_s)

    def transfer_seconds(self, message_bytes: float) -> float:
        if message_bytes <= 0:
            return 0.0
        return self.latency_s + message_bytes / self.bytes_per_second(message_bytes)


class NetworkProfile(BaseModel):
    """Bandwidth of one link class, optionally specific to GPU types and to a zone pair.

    `gpu_type` / `peer_gpu_type` narrow the profile to links between VMs of those GPU types
    (intra-node links are always specific to one GPU type); empty means any. `zone` /
    `peer_zone` narrow it further to one (sender zone, receiver zone) pair, `gpu_type` then
    being the sender's GPU and `peer_gpu_type` the receiver's: a zone-pair profile is one
    direction of one pair of pools' zones (A -> B may differ from B -> A); the all-reduce,
    which has no direction, is filed under the pair as its Job measured it. Empty zones: the
    profile stands for its whole link class (older stores, Sailor's class medians).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_version: Literal["sailplan.dev/v1alpha1", "sailplan.dev/v1alpha2"] = PROFILE_API_VERSION
    kind: Literal["NetworkProfile"] = "NetworkProfile"
    link: LinkClass
    gpu_type: str = ""
    peer_gpu_type: str = ""
    zone: str = Field(default="", description="sender's zone; empty = any zone of the class")
    peer_zone: str = Field(default="", description="receiver's zone; empty = any")
    gpus_per_node: int = Field(default=0, ge=0, description="0 = any")
    measure: Measure = "p2p"
    ranks: int = Field(default=0, ge=0, description="processes measured together; 0 = unsaid")
    curve: BandwidthCurve
    provenance: Provenance

    @model_validator(mode="before")
    @classmethod
    def _zone_pair_version(cls, data: object) -> object:
        """A zone-pair profile built without an api_version is a v1alpha2 document."""
        if (
            isinstance(data, dict)
            and (data.get("zone") or data.get("peer_zone"))
            and "api_version" not in data
        ):
            return {**data, "api_version": ZONE_PAIR_API_VERSION}
        return data

    @model_validator(mode="after")
    def _zones_complete(self) -> NetworkProfile:
        if bool(self.zone) != bool(self.peer_zone):
            raise ValueError("a zone-pair profile names both zone and peer_zone")
        if self.zone and self.api_version != ZONE_PAIR_API_VERSION:
            raise ValueError(f"a zone-pair profile is {ZONE_PAIR_API_VERSION}")
        if self.zone and (self.link == "intra-node" or not self.gpu_type or not self.peer_gpu_type):
            raise ValueError("a zone-pair profile is between nodes and names both GPU types")
        return self

    @property
    def zone_pair(self) -> bool:
        return bool(self.zone)

    @property
    def key(self) -> str:
        """Link and GPU pair (and zones): the profile-store key (one store entry holds every
        measure and node shape of a link, as one profiling Job measures them together)."""
        if self.zone_pair:
            return (
                f"network/{self.link}/{self.zone}/{self.gpu_type}/"
                f"{self.peer_zone}/{self.peer_gpu_type}"
            )
        pair = "/".join(x for x in (self.gpu_type, self.peer_gpu_type) if x)
        return f"network/{self.link}" + (f"/{pair}" if pair else "")


def zone_pair_key(  # noqa: PLR0917 (a link's coordinates)
    link: LinkClass, zone: str, gpu_type: str, peer_zone: str, peer_gpu_type: str, gpus: int
) -> str:
    """The store key of a zone pair's profiles: the two ends in sorted order (a profiling Job
    measures both directions into one entry), then the node shape."""
    (z1, g1), (z2, g2) = sorted(((zone, gpu_type), (peer_zone, peer_gpu_type)))
    return f"network/{link}/{z1}/{g1}/{z2}/{g2}/n{gpus}"


class PowerPoint(BaseModel):
    """One SM clock of a PowerProfile: the GPU's power under a training load at that clock,
    and how long the same work took relative to the maximum clock (None = use the energy
    model's roofline time model, planner/energy/power.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sm_mhz: int = Field(gt=0)
    watts: float = Field(gt=0)
    time_factor: float | None = Field(default=None, ge=1.0, description="t(f) / t(f_max)")


class PowerProfile(BaseModel):
    """Power against SM clock of one GPU type: overrides the catalog's datasheet model in
    the energy model (planner/energy/power.py EnergyModel) wherever a ProfileSet carries it.

    `points` are the clock levels the frequency planner may choose (the highest is the
    default clock a job runs at without clock locking); `idle_watts` and `blocking_watts`
    (a GPU waiting in NCCL or a pipeline bubble; default idle_watts) what it draws while not
    computing. Every point draws at least the blocking power."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    api_version: Literal["sailplan.dev/v1alpha1"] = PROFILE_API_VERSION
    kind: Literal["PowerProfile"] = "PowerProfile"
    gpu_type: str = Field(min_length=1)
    points: tuple[PowerPoint, ...] = Field(min_length=1)
    idle_watts: float = Field(ge=0)
    blocking_watts: float | None = Field(default=None, ge=0, description="None = idle_watts")
    provenance: Provenance

    @model_validator(mode="after")
    def _consistent(self) -> PowerProfile:
        clocks = [p.sm_mhz for p in self.points]
        if len(set(clocks)) != len(clocks):
            raise ValueError("PowerProfile points need distinct sm_mhz")
        blocking = self.idle_watts if self.blocking_watts is None else self.blocking_watts
        low = min(self.points, key=lambda p: p.watts)
        if low.watts < blocking:
            raise ValueError(
                f"the point at {low.sm_mhz} MHz draws {low.watts:g} W, below the blocking "
                f"power {blocking:g} W (a GPU computing draws at least what it draws waiting)"
            )
        timed = [p.time_factor is not None for p in self.points]
        if any(timed) and not all(timed):
            raise ValueError("give time_factor for every point or for none")
        ordered = sorted(self.points, key=lambda p: -p.sm_mhz)
        if all(timed):
            if ordered[0].time_factor != 1.0:
                raise ValueError("time_factor at the highest sm_mhz must be 1.0")
            factors = [p.time_factor or 1.0 for p in ordered]
            if any(b < a for a, b in itertools.pairwise(factors)):
                raise ValueError("time_factor must not fall as the clock is lowered")
        return self

    @property
    def key(self) -> str:
        return f"power/{self.gpu_type}"


class ProfileSet(BaseModel):
    """All profiles the planner may use, with the lookups the simulator needs.

    Where a measured and an estimated profile share a key, the measured one wins.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute: tuple[ComputeProfile, ...] = ()
    network: tuple[NetworkProfile, ...] = ()
    power: tuple[PowerProfile, ...] = ()

    def power_profiles(self) -> tuple[PowerProfile, ...]:
        """One PowerProfile per GPU type (as named in the documents): measured beats
        estimated, and among equals the later one wins (a later store entry)."""
        chosen: dict[str, PowerProfile] = {}
        for profile in self.power:
            current = chosen.get(profile.gpu_type)
            if current is None or _rank(profile.provenance) >= _rank(current.provenance):
                chosen[profile.gpu_type] = profile
        return tuple(chosen[g] for g in sorted(chosen))

    @cached_property
    def _compute_index(self) -> dict[tuple[str, str, int, int], ComputeProfile]:
        index: dict[tuple[str, str, int, int], ComputeProfile] = {}
        for profile in self.compute:
            key = (
                profile.model,
                profile.gpu_type,
                profile.tensor_parallel,
                profile.micro_batch_size,
            )
            current = index.get(key)
            if current is None or _rank(profile.provenance) > _rank(current.provenance):
                index[key] = profile
        return index

    def compute_profile(
        self, model: str, gpu_type: str, tensor_parallel: int, micro_batch_size: int
    ) -> ComputeProfile | None:
        return self._compute_index.get((model, gpu_type, tensor_parallel, micro_batch_size))

    def compute_grid(self, model: str, gpu_type: str) -> list[tuple[int, int]]:
        """(tensor_parallel, micro_batch_size) points available for a model on a GPU type."""
        return sorted(
            (tp, mbs) for (m, g, tp, mbs) in self._compute_index if m == model and g == gpu_type
        )

    def network_profile(
        self,
        link: LinkClass,
        gpu_type: str = "",
        peer_gpu_type: str = "",
        gpus_per_node: int = 0,
        measure: Measure = "p2p",
    ) -> NetworkProfile | None:
        """Most specific profile for a link: exact GPU pair, then either order, then generic.

        Within one GPU pair, a profile measured with `gpus_per_node` GPUs per VM beats one
        for any count (0), which beats one for another count; measured beats estimated.
        Only profiles of the asked `measure` count (a bus bandwidth is not a p2p rate), and
        only profiles of the whole class: a zone pair's curve is zone_pair_profile's.
        """
        candidates = [
            p for p in self.network if p.link == link and p.measure == measure and not p.zone_pair
        ]
        wanted = [
            (gpu_type, peer_gpu_type),
            (peer_gpu_type, gpu_type),
            (gpu_type, ""),
            ("", ""),
        ]
        for g, peer in wanted:
            matches = [p for p in candidates if p.gpu_type == g and p.peer_gpu_type == peer]
            if matches:
                return max(
                    matches,
                    key=lambda p: (
                        _rank(p.provenance),
                        2 if p.gpus_per_node == gpus_per_node else 1 if p.gpus_per_node == 0 else 0,
                        -abs(p.gpus_per_node - gpus_per_node),
                    ),
                )
        return None

    def zone_pair_profile(  # noqa: PLR0917 (a link's coordinates)
        self,
        zone: str,
        gpu_type: str,
        peer_zone: str,
        peer_gpu_type: str,
        gpus_per_node: int = 0,
        measure: Measure = "p2p",
    ) -> NetworkProfile | None:
        """The profile measured from (zone, gpu_type) to (peer_zone, peer_gpu_type): that
        direction and GPU pair only; within it measured beats estimated, then the node shape
        `gpus_per_node` beats any (0) beats the nearest other shape."""
        matches = self._zone_pair_index.get((zone, gpu_type, peer_zone, peer_gpu_type, measure))
        if not matches:
            return None
        return max(
            matches,
            key=lambda p: (
                _rank(p.provenance),
                2 if p.gpus_per_node == gpus_per_node else 1 if p.gpus_per_node == 0 else 0,
                -abs(p.gpus_per_node - gpus_per_node),
            ),
        )

    def zone_pair_profiles(
        self, link: LinkClass, gpu_type: str, peer_gpu_type: str, measure: Measure = "p2p"
    ) -> tuple[NetworkProfile, ...]:
        """Every measured zone-pair profile of a link class between two GPU types (either
        direction), in a stable order: what a class curve may be made of."""
        return tuple(
            p
            for p in self.network
            if p.zone_pair
            and p.link == link
            and p.measure == measure
            and p.provenance.source == "measured"
            and {p.gpu_type, p.peer_gpu_type} == {gpu_type, peer_gpu_type}
        )

    @cached_property
    def _zone_pair_index(
        self,
    ) -> dict[tuple[str, str, str, str, Measure], list[NetworkProfile]]:
        index: dict[tuple[str, str, str, str, Measure], list[NetworkProfile]] = {}
        for p in self.network:
            if p.zone_pair:
                key = (p.zone, p.gpu_type, p.peer_zone, p.peer_gpu_type, p.measure)
                index.setdefault(key, []).append(p)
        return index

    def merged(self, other: ProfileSet) -> ProfileSet:
        return ProfileSet(
            compute=self.compute + other.compute,
            network=self.network + other.network,
            power=self.power + other.power,
        )


def _rank(provenance: Provenance) -> int:
    return 1 if provenance.source == "measured" else 0
