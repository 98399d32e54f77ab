"""What makes predictions hold on clusters the simulator was not calibrated on.

Pipeline sends move one copy of the boundary tensor whatever the TP degree (as both
runtimes do); a profile file that cannot be its folder's model is rejected with one line.
(A model measured on other GPUs is estimated from them by the GPU ratio of models measured
on both: test_profiles_transfer.py.) Each expectation follows from the inputs by hand.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from profile_cases import MEASURED, profile

from sailplan.planner.catalog import default_catalog
from sailplan.planner.cli_inputs import InputError
from sailplan.planner.cli_sources import load_profiles
from sailplan.planner.cluster import ClusterSnapshot, Pool
from sailplan.planner.plan import Plan, Replica, Stage
from sailplan.planner.profiles.sailor import import_artifact
from sailplan.planner.profiles.types import (
    NetworkProfile,
    ProfileSet,
)
from sailplan.planner.simulator import DEFAULT_CONSTANTS, PlanningContext, simulate
from sailplan.planner.simulator.costs import Endpoint, flat_curve

CATALOG = default_catalog()
OPT = CATALOG.model("OPT-350M")
NEO = CATALOG.model("GPT-Neo-2.7B")


# -- pipeline sends: one copy crosses the network ----------------------------------------


def nic_context(partitioned: bool) -> PlanningContext:
    """Two 4-GPU A100 nodes whose NIC carries exactly 1 GB/s whatever the message."""
    pools = (Pool(name="a", gpu_type="A100-40", zone="us-central1-a", gpus_per_node=4, nodes=2),)
    network = ProfileSet(
        network=(
            NetworkProfile(
                link="intra-zone",
                gpu_type="A100-40",
                peer_gpu_type="A100-40",
                gpus_per_node=4,
                measure="concurrent",
                curve=flat_curve(1e9),
                provenance=MEASURED,
            ),
        )
    )
    constants = dataclasses.replace(DEFAULT_CONSTANTS, partitioned_p2p=partitioned)
    return PlanningContext(
        model=OPT, cluster=ClusterSnapshot(pools=pools), profiles=network, constants=constants
    )


@pytest.mark.parametrize("partitioned", [False, True])
def test_a_tp4_boundary_moves_one_copy_through_the_nic_not_four(partitioned: bool) -> None:
    costs = nic_context(partitioned).costs
    end = Endpoint("a", "A100-40", "us-central1-a")
    nbytes = 1e8
    seconds = costs.boundary_seconds(nbytes, end, end, 4, 4)
    # the TP-4 group owns the whole 4-GPU node: 1e8 B at 1 GB/s = 0.1 s on the network, then
    # a broadcast or all-gather inside the receiving node over NVLink (~1e8 / 300e9 s)
    assert seconds == pytest.approx(0.1, rel=0.01)
    assert seconds < 4 * 0.1 / 2


def test_the_trainer_broadcasts_inside_the_node_and_deepspeed_all_gathers_less() -> None:
    end = Endpoint("a", "A100-40", "us-central1-a")
    trainer = nic_context(False).costs.boundary_seconds(1e8, end, end, 4, 4)
    deepspeed = nic_context(True).costs.boundary_seconds(1e8, end, end, 4, 4)
    network = nic_context(False).costs.p2p_seconds(1e8, end, end, 4)
    # the broadcast moves the whole tensor over each link, the all-gather 3/4 of it
    assert trainer > deepspeed > network


def test_cross_zone_egress_counts_one_copy_per_micro_batch_and_direction() -> None:
    pools = (
        Pool(name="a", gpu_type="A100-40", zone="us-central1-a", gpus_per_node=4, nodes=1),
        Pool(name="b", gpu_type="A100-40", zone="us-central1-b", gpus_per_node=4, nodes=1),
    )
    stages = (
        Stage(
            layer_start=0,
            layer_end=13,
            tensor_parallel=4,
            replicas=(Replica(pool="a", gpu_type="A100-40", zone="us-central1-a"),),
        ),
        Stage(
            layer_start=13,
            layer_end=26,
            tensor_parallel=4,
            replicas=(Replica(pool="b", gpu_type="A100-40", zone="us-central1-b"),),
        ),
    )
    plan = Plan(
        model=OPT, global_batch_size=4, micro_batch_size=1, num_micro_batches=4, stages=stages
    )
    measured = ProfileSet(compute=(profile(OPT.name, "A100-40", [0.01] * 26, tp=4),))
    context = PlanningContext(model=OPT, cluster=ClusterSnapshot(pools=pools), profiles=measured)
    boundary = context.costs.boundary_bytes(1, 13)
    assert simulate(plan, context).egress_bytes_per_iteration == pytest.approx(2 * 4 * boundary)


# -- the importer rejects a profile that cannot be its folder's model ---------------------


def write_profile(root: Path, model_dir: str, gpu_dir: str, layers: int, scale: float) -> Path:
    path = root / "profiles" / model_dir / gpu_dir / "profile.json"
    path.parent.mkdir(parents=True)
    entry = {str(i): [0.01 * scale, 0.02 * scale, 0.001] for i in range(layers)}
    path.write_text(json.dumps({"1": {"1": entry}}))
    return path


def test_a_mislabelled_copy_is_rejected_with_one_line_and_the_original_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original = write_profile(tmp_path, "OPT-350", "GH-96", 26, 1.0)
    copy = tmp_path / "profiles" / "GPT-Neo-2.7" / "GH-96" / "profile.json"
    copy.parent.mkdir(parents=True)
    copy.write_text(original.read_text())
    write_profile(tmp_path, "GPT-Neo-2.7", "A100-40", 34, 3.0)
    imported = import_artifact(tmp_path, CATALOG)
    assert len(imported.rejected) == 1
    line = imported.rejected[0]
    assert str(copy) in line and "26 layers" in line and str(original) in line
    kept = {(p.model, p.gpu_type) for p in imported.profiles.compute}
    assert kept == {(OPT.name, "GH200-96"), (NEO.name, "A100-40")}
    # the CLI's import summary warns with that line, once, and goes on
    load_profiles(tmp_path, CATALOG)
    warnings = [w for w in capsys.readouterr().err.splitlines() if w.startswith("warning:")]
    assert warnings == [f"warning: {line}"]


def test_an_unreadable_artifact_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "profiles" / "OPT-350" / "GH-96" / "profile.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(InputError, match="cannot read"):
        load_profiles(tmp_path, CATALOG)


# -- slow links between machines of different GPU types ---------------------------------


def measured_link(gpu: str, peer: str, bytes_per_s: float) -> NetworkProfile:
    return NetworkProfile(
        link="intra-zone",
        gpu_type=gpu,
        peer_gpu_type=peer,
        gpus_per_node=1,
        curve=flat_curve(bytes_per_s),
        provenance=MEASURED,
    )


CONSUMER = ClusterSnapshot(
    pools=(
        Pool(name="t", gpu_type="Titan-RTX", zone="us-central1-a", gpus_per_node=1, nodes=2),
        Pool(name="r", gpu_type="RTX-3090", zone="us-central1-a", gpus_per_node=1, nodes=2),
    )
)
TITAN = Endpoint("t", "Titan-RTX", "us-central1-a")
RTX3090 = Endpoint("r", "RTX-3090", "us-central1-a")
GBIT = 1e9 / 8


def consumer_context() -> PlanningContext:
    """Titan VMs talk at 23 Gbit/s among themselves, everything that touches an RTX-3090
    VM at 1 Gbit/s (the artifact's consumer cluster, in round numbers)."""
    links = (
        measured_link("Titan-RTX", "Titan-RTX", 23 * GBIT),
        measured_link("RTX-3090", "RTX-3090", GBIT),
        measured_link("Titan-RTX", "RTX-3090", GBIT),
    )
    return PlanningContext(model=OPT, cluster=CONSUMER, profiles=ProfileSet(network=links))


def test_a_1_gbit_link_makes_the_dp_all_reduce_cost_2_n_minus_1_over_n_bytes_over_bandwidth() -> (
    None
):
    costs = consumer_context().costs
    grads = 2.0 * OPT.total_parameters()  # 16-bit gradients of the whole 350M model
    for replicas in ([TITAN, RTX3090], [TITAN, TITAN, RTX3090, RTX3090]):
        n = len(replicas)
        expected = 2 * (n - 1) / n * grads / GBIT  # the ring at its slowest (1 Gbit/s) edge
        assert costs.allreduce_seconds(grads, replicas) == pytest.approx(expected, rel=0.01)
    # the same ring among Titans only runs at their 23 Gbit/s
    fast = costs.allreduce_seconds(grads, [TITAN, TITAN])
    assert fast == pytest.approx(grads / (23 * GBIT), rel=0.01)


def test_a_pipeline_send_uses_the_measured_fit_of_its_sender_receiver_pair() -> None:
    costs = consumer_context().costs
    nbytes = 8e6
    # Titan -> Titan: 23 Gbit/s; Titan -> RTX-3090: the pair's 1 Gbit/s, not the Titan's NIC
    assert costs.boundary_seconds(nbytes, TITAN, TITAN) == pytest.approx(
        nbytes / (23 * GBIT), rel=0.01
    )
    assert costs.boundary_seconds(nbytes, TITAN, RTX3090) == pytest.approx(nbytes / GBIT, rel=0.01)


def test_a_tp_group_spread_over_one_gpu_machines_reduces_through_all_their_nics() -> None:
    costs = consumer_context().costs
    grads = 2.0 * OPT.total_parameters()
    # TP 2 over 1-GPU Titan VMs: each TP rank's DP ring carries half the gradients through
    # its own VM's NIC, at the same time as the other rank's
    spread = costs.allreduce_seconds(grads, [TITAN, TITAN], tp=2)
    assert spread == pytest.approx(grads / 2 / (23 * GBIT), rel=0.01)
    # DeepSpeed's partitioned send leaves from both VMs; the trainer's one flow from one
    end = TITAN
    nbytes = 8e6
    partitioned = dataclasses.replace(DEFAULT_CONSTANTS, partitioned_p2p=True)
    both = PlanningContext(
        model=OPT,
        cluster=CONSUMER,
        profiles=consumer_context().profiles,
        constants=partitioned,
    ).costs.p2p_seconds(nbytes, end, end, 2, flows=2)
    one = costs.p2p_seconds(nbytes, end, end, 2)
    assert both == pytest.approx(one / 2, rel=0.05)
