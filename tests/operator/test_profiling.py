"""Profiling: what is missing under each policy, the rendered Jobs, results into the store,
and progress from Job states. Pure: no cluster; the profiler CLI is only parsed, not run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from operator_builders import JOB_SPEC, pool

from sailplan.operator.api.gpupool import GPU_RESOURCE, NODEPOOL_LABEL, ZONE_LABEL
from sailplan.operator.api.trainingjob import TrainingJob
from sailplan.operator.profilestore import parse_profile_configmaps
from sailplan.operator.profiling import jobs, results, status
from sailplan.operator.profiling.needs import (
    ComputeNeed,
    NetworkNeed,
    missing_profiles,
    need_id,
    profiling_decision,
)
from sailplan.operator.profiling.report import render
from sailplan.operator.reconcile import naming
from sailplan.operator.reconcile.snapshot import build_snapshot
from sailplan.planner.catalog import default_catalog
from sailplan.planner.modelspec import ModelSpec
from sailplan.planner.profiles.store import write_profile
from sailplan.planner.profiles.types import (
    BandwidthCurve,
    ComputeProfile,
    NetworkProfile,
    ProfileSet,
    Provenance,
)
from sailplan.trainer.profilers.cli import app as profiler_cli

MODEL = default_catalog().model("OPT-350M")
MEASURED = Provenance(source="measured", tool="sailplan-profile")
ESTIMATED = Provenance(source="estimated", tool="roofline")
A, B, WEST = "us-central1-a", "us-central1-b", "us-west1-b"
POOLS = (
    pool("a100", "a100-ondemand", {A: 2, B: 1}),
    pool("v100", "v100-spot", {WEST: 1}, gpu_type="V100-16", gpus_per_node=1, spot=True),
)
CLUSTER = build_snapshot(POOLS)
BY_NAME = {p.name: p for p in POOLS}


def compute(gpu: str = "A100-40", provenance: Provenance = MEASURED) -> ComputeProfile:
    return ComputeProfile(
        model="OPT-350M",
        gpu_type=gpu,
        tensor_parallel=1,
        micro_batch_size=1,
        forward_s=(0.001,) * MODEL.num_layers,
        backward_s=(0.002,) * MODEL.num_layers,
        update_s=(0.0001,) * MODEL.num_layers,
        provenance=provenance,
    )


def network(  # noqa: PLR0917 (a profile's identity)
    link: Any,
    gpu: str = "",
    peer: str = "",
    source: Provenance = MEASURED,
    gpus_per_node: int = 0,
    measure: Any = "p2p",
) -> NetworkProfile:
    curve = BandwidthCurve(coefficients=(0.0, 0.0, 1.0), max_bytes_per_s=1e9)
    return NetworkProfile(
        link=link,
        gpu_type=gpu,
        peer_gpu_type=peer,
        gpus_per_node=gpus_per_node,
        measure=measure,
        curve=curve,
        provenance=source,
    )


def zone_network(  # noqa: PLR0917 (a profile's identity)
    link: Any,
    zone: str,
    gpu: str,
    peer_zone: str,
    peer: str,
    gpus_per_node: int,
    measure: Any = "p2p",
    source: Provenance = MEASURED,
) -> NetworkProfile:
    """One direction of a zone pair (sender first)."""
    return NetworkProfile(
        link=link,
        gpu_type=gpu,
        peer_gpu_type=peer,
        zone=zone,
        peer_zone=peer_zone,
        gpus_per_node=gpus_per_node,
        measure=measure,
        curve=BandwidthCurve(coefficients=(0.0, 0.0, 1.0), max_bytes_per_s=1e9),
        provenance=source,
    )


def keys(measured: ProfileSet) -> list[str]:
    return [n.key for n in missing_profiles(MODEL, 32, CLUSTER, measured)]


def test_an_empty_store_misses_every_profile_the_pools_need() -> None:
    # Two GPU types -> two compute runs. Links: NVLink inside the 4-GPU A100 nodes (the
    # 1-GPU V100 nodes have none), A100<->A100 inside zone a (2 nodes there), A100 zone a
    # <-> zone b (same region: inter-zone), and A100 in each of zones a and b <-> V100 in
    # us-west1 (inter-region): across zones every pair of zones is its own need. Each key
    # ends in the GPUs per node the measurement runs with (the smaller node of a pair).
    assert keys(ProfileSet()) == [
        "compute/OPT-350M/A100-40",
        "compute/OPT-350M/V100-16",
        f"network/inter-region/{A}/A100-40/{WEST}/V100-16/n1",
        f"network/inter-region/{B}/A100-40/{WEST}/V100-16/n1",
        f"network/inter-zone/{A}/A100-40/{B}/A100-40/n4",
        "network/intra-node/A100-40/A100-40/n4",
        "network/intra-zone/A100-40/A100-40/n4",
    ]


def test_measured_profiles_satisfy_needs_estimated_ones_do_not() -> None:
    store = ProfileSet(
        compute=(compute("A100-40"), compute("V100-16", ESTIMATED)),
        network=(
            # both directions of the 4-GPU A100 nodes between zones a and b: measured
            zone_network("inter-zone", A, "A100-40", B, "A100-40", 4),
            zone_network("inter-zone", B, "A100-40", A, "A100-40", 4),
            zone_network("inter-region", WEST, "V100-16", A, "A100-40", 1, source=ESTIMATED),
            zone_network("inter-region", A, "A100-40", WEST, "V100-16", 1, source=ESTIMATED),
        ),
    )
    assert keys(store) == [
        "compute/OPT-350M/V100-16",
        f"network/inter-region/{A}/A100-40/{WEST}/V100-16/n1",
        f"network/inter-region/{B}/A100-40/{WEST}/V100-16/n1",
        "network/intra-node/A100-40/A100-40/n4",
        "network/intra-zone/A100-40/A100-40/n4",
    ]


def test_a_zone_pair_needs_both_directions_of_exactly_its_zones() -> None:
    pair = f"network/inter-zone/{A}/A100-40/{B}/A100-40/n4"
    # a class-wide curve (an older store) does not stand for the pair any more
    whole = network("inter-zone", "A100-40", "A100-40", gpus_per_node=4, measure="concurrent")
    assert pair in keys(ProfileSet(network=(whole,)))
    one_way = zone_network("inter-zone", A, "A100-40", B, "A100-40", 4)
    assert pair in keys(ProfileSet(network=(one_way,)))
    other_shape = zone_network("inter-zone", B, "A100-40", A, "A100-40", 8)
    assert pair in keys(ProfileSet(network=(one_way, other_shape)))
    back = zone_network("inter-zone", B, "A100-40", A, "A100-40", 4)
    assert pair not in keys(ProfileSet(network=(one_way, back)))
    # ... and one pair of zones does not stand for another: B <-> WEST is still missing
    a_west = (
        zone_network("inter-region", A, "A100-40", WEST, "V100-16", 1),
        zone_network("inter-region", WEST, "V100-16", A, "A100-40", 1),
    )
    missing = keys(ProfileSet(network=a_west))
    assert f"network/inter-region/{A}/A100-40/{WEST}/V100-16/n1" not in missing
    assert f"network/inter-region/{B}/A100-40/{WEST}/V100-16/n1" in missing


def test_p2p_profiles_alone_leave_the_network_model_short() -> None:
    # What the store held before collectives were profiled: one flow per link. The simulator
    # needs the node's all-reduce and concurrent flows, so those links are profiled again.
    old_style = ProfileSet(
        network=(
            network("intra-node", "A100-40", "A100-40", gpus_per_node=4),
            network("intra-zone", "A100-40", "A100-40", gpus_per_node=4),
        )
    )
    assert "network/intra-node/A100-40/A100-40/n4" in keys(old_style)
    assert "network/intra-zone/A100-40/A100-40/n4" in keys(old_style)
    # ... and an all-reduce measured on another node shape does not stand for this one.
    other_shape = ProfileSet(
        network=(network("intra-node", "A100-40", "A100-40", gpus_per_node=8, measure="allreduce"),)
    )
    assert "network/intra-node/A100-40/A100-40/n4" in keys(other_shape)
    same_shape = ProfileSet(
        network=(network("intra-node", "A100-40", "A100-40", gpus_per_node=4, measure="allreduce"),)
    )
    assert "network/intra-node/A100-40/A100-40/n4" not in keys(same_shape)


def test_two_node_shapes_of_one_gpu_type_are_profiled_apart() -> None:
    pools = (
        pool("big", "a100-8g", {A: 2}, gpus_per_node=8),
        pool("small", "a100-2g", {A: 2}, gpus_per_node=2),
    )
    found = [n.key for n in missing_profiles(MODEL, 32, build_snapshot(pools), ProfileSet())]
    network_keys = [k for k in found if k.startswith("network/")]
    assert network_keys == [
        "network/intra-node/A100-40/A100-40/n2",
        "network/intra-node/A100-40/A100-40/n8",
        "network/intra-zone/A100-40/A100-40/n2",  # small<->small and big<->small: 2 flows
        "network/intra-zone/A100-40/A100-40/n8",
    ]


def test_compute_grid_matches_what_the_planner_searches() -> None:
    (a100,) = [
        n
        for n in missing_profiles(MODEL, 24, CLUSTER, ProfileSet())
        if n.key == "compute/OPT-350M/A100-40"
    ]
    assert isinstance(a100, ComputeNeed)
    # OPT-350M has 16 heads: TP 1, 2, 4 fit a 4-GPU node (3 does not divide 16).
    assert a100.tensor_parallel == (1, 2, 4)
    # Divisors of the global batch 24 up to 32 (planner.api's micro-batch grid).
    assert a100.micro_batch_sizes == (1, 2, 3, 4, 6, 8, 12, 24)
    assert (a100.site.gpupool, a100.site.zone) == ("a100", A)


def test_policy_decides_whether_to_plan_and_whether_to_profile() -> None:
    needs = missing_profiles(MODEL, 32, CLUSTER, ProfileSet())
    auto = profiling_decision("Auto", needs)
    assert auto.may_plan and auto.launch == needs
    required = profiling_decision("Required", needs)
    assert not required.may_plan and required.launch == needs
    skip = profiling_decision("Skip", needs)
    assert skip.may_plan and skip.launch == ()
    done = profiling_decision("Required", ())
    assert done.may_plan and done.launch == ()


@pytest.fixture
def job() -> TrainingJob:
    return TrainingJob.model_validate(
        {"name": "opt", "namespace": "team-a", "uid": "uid-1", "spec": JOB_SPEC}
    )


def _needs(kind: type[Any]) -> list[Any]:
    return [n for n in missing_profiles(MODEL, 32, CLUSTER, ProfileSet()) if isinstance(n, kind)]


def _parses(command: list[str]) -> None:
    """The command's flags are the profiler CLI's own: click parses them (nothing runs)."""
    assert command[0] == "sailplan-profile"
    click_command = typer.main.get_command(profiler_cli)
    context = click_command.make_context("sailplan-profile", command[1:2], resilient_parsing=True)
    sub = click_command.get_command(context, command[1])  # type: ignore[attr-defined]
    assert sub is not None
    sub.make_context(command[1], command[2:])


def test_compute_job_is_pinned_owned_bounded_and_findable(job: TrainingJob) -> None:
    need = _needs(ComputeNeed)[0]
    rendered = jobs.render_compute_job(job, need, BY_NAME["a100"])
    meta, spec = rendered["metadata"], rendered["spec"]
    assert meta["ownerReferences"][0]["uid"] == "uid-1"
    assert meta["labels"][jobs.LABEL_NEED] == need_id(need)
    assert meta["labels"][naming.LABEL_JOB] == "opt"
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (1, 1800)
    assert spec["ttlSecondsAfterFinished"] == 3600
    pod = spec["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expressions = terms["nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": NODEPOOL_LABEL, "operator": "In", "values": ["a100-ondemand"]} in expressions
    assert {"key": ZONE_LABEL, "operator": "In", "values": [A]} in expressions
    (profiler,) = pod["initContainers"]
    # TP up to 4 is profiled with one process per GPU: the whole 4-GPU node.
    assert profiler["resources"]["limits"][GPU_RESOURCE] == "4"
    assert pod["tolerations"][0]["key"] == GPU_RESOURCE
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False  # no API access from the pod
    (report,) = pod["containers"]
    assert GPU_RESOURCE not in report["resources"]["requests"]
    _parses(profiler["command"])
    # The model file is the ModelSpec, served from the pod's own annotation.
    annotation = spec["template"]["metadata"]["annotations"][jobs.MODEL_ANNOTATION]
    assert annotation == MODEL.model_dump_json()
    assert f"{jobs.MODEL_DIR}/model.json" in profiler["command"]


def _zone_a_to_west() -> NetworkNeed:
    (need,) = [n for n in _needs(NetworkNeed) if n.link == "inter-region" and n.site.zone == A]
    return need


def test_cross_pool_network_pair_is_two_jobs_and_a_service(job: TrainingJob) -> None:
    need = _zone_a_to_west()
    service, rank0, rank1 = jobs.render_network_objects(job, need, BY_NAME)
    pod0, pod1 = rank0["spec"]["template"]["spec"], rank1["spec"]["template"]["spec"]

    def zone_of(pod: dict[str, Any]) -> list[str]:
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        exprs = terms["nodeSelectorTerms"][0]["matchExpressions"]
        return [e["values"][0] for e in exprs if e["key"] == ZONE_LABEL]

    # Each rank on its own pool and zone: what one Indexed Job's single template cannot do.
    assert (zone_of(pod0), zone_of(pod1)) == ([A], [WEST])
    # Rank 1 dials rank 0's stable DNS name: hostname.subdomain(service).namespace.svc.
    env1 = {e["name"]: e["value"] for e in pod1["initContainers"][0]["env"]}
    assert env1["MASTER_ADDR"] == f"{pod0['hostname']}.{pod0['subdomain']}.team-a.svc"
    assert pod0["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == rank0["spec"]["template"]["metadata"]["labels"]
    assert env1["RANK"] == "1"
    # The spot V100 side tolerates the spot taint; the on-demand A100 side does not need to.
    assert len(pod1["tolerations"]) == 2 and len(pod0["tolerations"]) == 1
    assert "podAntiAffinity" in pod0["affinity"]
    for pod in (pod0, pod1):
        _parses(pod["initContainers"][0]["command"])
        # one GPU per flow: the 1-GPU V100 node bounds the pair to one flow per node
        (profiler,) = pod["initContainers"]
        assert profiler["resources"]["limits"][GPU_RESOURCE] == "1"
        assert _flag(profiler["command"], "--procs-per-node") == "1"
    # each rank files its curves under its own zone and its peer's: the pair, both ways
    zones = [
        (
            _flag(p["initContainers"][0]["command"], "--zone"),
            _flag(p["initContainers"][0]["command"], "--peer-zone"),
        )
        for p in (pod0, pod1)
    ]
    assert zones == [(A, WEST), (WEST, A)]


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


PROFILING_OVERRIDES: dict[str, Any] = {
    "metadata": {"labels": {"cost-center": "ml"}, "annotations": {"example.com/owner": "alice"}},
    "spec": {
        # the pool pin wins over a conflicting entry; the other one is added
        "nodeSelector": {"example.com/disk": "ssd", NODEPOOL_LABEL: "elsewhere"},
        "tolerations": [{"key": "example.com/dedicated", "operator": "Exists"}],
        "imagePullSecrets": [{"name": "registry"}],
        "securityContext": {"runAsUser": 2000},
        "affinity": {
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        },
        "priorityClassName": "training-high",
        "terminationGracePeriodSeconds": 600,
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "corpus"}}],
        "containers": [
            {
                "name": "trainer",
                "env": [
                    {"name": "HF_HOME", "value": "/tmp/hf"},
                    {"name": "MASTER_ADDR", "value": "mine"},
                ],
                "envFrom": [{"secretRef": {"name": "hub"}}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "securityContext": {"readOnlyRootFilesystem": False},
                "resources": {"requests": {"cpu": "8"}},
            }
        ],
    },
}


def test_profiling_pods_take_the_overrides_that_concern_running_there(job: TrainingJob) -> None:
    need = _zone_a_to_west()
    _, _, plain = jobs.render_network_objects(job, need, BY_NAME)
    spec = JOB_SPEC | {"podTemplateOverrides": PROFILING_OVERRIDES}
    overridden = TrainingJob.model_validate(
        {"name": "opt", "namespace": "team-a", "uid": "uid-1", "spec": spec}
    )
    _, _, rank1 = jobs.render_network_objects(overridden, need, BY_NAME)
    before, after = plain["spec"]["template"], rank1["spec"]["template"]
    pod, was = after["spec"], before["spec"]
    # Applied: metadata (the operator's labels kept), scheduling, pulling, identity, env.
    assert after["metadata"]["labels"] == before["metadata"]["labels"] | {"cost-center": "ml"}
    assert after["metadata"]["annotations"]["example.com/owner"] == "alice"
    assert pod["nodeSelector"] == {"example.com/disk": "ssd"}
    assert pod["tolerations"] == [
        *was["tolerations"],
        {"key": "example.com/dedicated", "operator": "Exists"},
    ]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["securityContext"] == was["securityContext"] | {"runAsUser": 2000}
    for container in (*pod["initContainers"], *pod["containers"]):
        assert container["securityContext"]["readOnlyRootFilesystem"] is False
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
    profiler, report = pod["initContainers"][0], pod["containers"][0]
    env = {e["name"]: e["value"] for e in profiler["env"]}
    assert env["HF_HOME"] == "/tmp/hf"
    assert (
        env["MASTER_ADDR"]
        == {e["name"]: e["value"] for e in was["initContainers"][0]["env"]}["MASTER_ADDR"]
    )
    assert profiler["envFrom"] == [{"secretRef": {"name": "hub"}}]
    assert "env" not in report or not any(e["name"] == "HF_HOME" for e in report["env"])
    # Not applied: the measurement's placement, priority, volumes, resources, grace period.
    assert pod["affinity"] == was["affinity"]
    for field in ("priorityClassName", "terminationGracePeriodSeconds"):
        assert field not in pod
    assert pod["volumes"] == was["volumes"]
    assert profiler["volumeMounts"] == was["initContainers"][0]["volumeMounts"]
    assert profiler["resources"] == was["initContainers"][0]["resources"]


def test_same_shape_pair_uses_every_gpu_of_both_nodes(job: TrainingJob) -> None:
    (need,) = [n for n in _needs(NetworkNeed) if n.link == "intra-zone"]
    _, rank0, rank1 = jobs.render_network_objects(job, need, BY_NAME)
    for rendered in (rank0, rank1):
        (profiler,) = rendered["spec"]["template"]["spec"]["initContainers"]
        assert profiler["resources"]["limits"][GPU_RESOURCE] == "4"
        command = profiler["command"]
        assert _flag(command, "--procs-per-node") == "4"
        assert _flag(command, "--gpus-per-node") == "4"
        assert set(_flag(command, "--measure").split(",")) == {"p2p", "concurrent", "allreduce"}


def test_intra_node_network_is_one_pod_with_all_the_nodes_gpus(job: TrainingJob) -> None:
    (need,) = [n for n in _needs(NetworkNeed) if n.link == "intra-node"]
    (rendered,) = jobs.render_network_objects(job, need, BY_NAME)
    (profiler,) = rendered["spec"]["template"]["spec"]["initContainers"]
    assert profiler["resources"]["limits"][GPU_RESOURCE] == "4"
    # Without RANK the CLI runs every rank locally, one per GPU.
    assert not any(e["name"] == "RANK" for e in profiler["env"])
    assert _flag(profiler["command"], "--gpus-per-node") == "4"
    assert _flag(profiler["command"], "--procs-per-node") == "4"
    _parses(profiler["command"])


def test_all_objects_have_distinct_names(job: TrainingJob) -> None:
    needs = missing_profiles(MODEL, 32, CLUSTER, ProfileSet())
    objects = jobs.render_profiling_objects(job, needs, BY_NAME)
    # 2 compute + intra-node = 3 single Jobs; 4 cross-node pairs (in zone a, a <-> b, and
    # each A100 zone <-> us-west1) = 4 x (2 Jobs + a Service).
    assert len(objects) == 3 + 4 * 3
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(set(names)) == len(names)
    assert all(len(name) <= 63 for _, name in names)


def test_results_travel_from_files_to_a_store_configmap(tmp_path: Path) -> None:
    need = _needs(ComputeNeed)[0]  # A100-40
    write_profile(tmp_path, compute("A100-40"))
    write_profile(tmp_path, compute("V100-16"))  # not what this Job was asked for
    log = "UserWarning: something from torch\n" + render(tmp_path) + "bye\n"
    configmap = results.collect(log, need, "sailplan-system", "team-a/opt-prof-x")
    assert configmap["metadata"]["namespace"] == "sailplan-system"
    assert "ownerReferences" not in configmap["metadata"]  # profiles outlive the job
    # The operator's own store reader finds exactly the A100 profile again.
    found, problems = parse_profile_configmaps([configmap])
    assert problems == []
    assert [(p.gpu_type, p.provenance.source) for p in found.compute] == [("A100-40", "measured")]
    assert naming.LABEL_PROFILE in configmap["metadata"]["labels"]


def test_report_module_runs_as_the_container_command(tmp_path: Path) -> None:
    write_profile(tmp_path, network("inter-region", "A100-40", "V100-16"))
    done = subprocess.run(
        [sys.executable, "-m", "sailplan.operator.profiling.report", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    parsed = results.parse_report(done.stdout)
    assert [p.key for p in parsed.network] == ["network/inter-region/A100-40/V100-16"]


def test_pair_results_keep_every_measure_under_the_needs_key(tmp_path: Path) -> None:
    (need,) = [n for n in _needs(NetworkNeed) if n.link == "intra-zone"]
    for measure in ("p2p", "concurrent", "allreduce"):
        write_profile(
            tmp_path,
            network("intra-zone", "A100-40", "A100-40", gpus_per_node=4, measure=measure),
        )
    write_profile(tmp_path, network("inter-zone", "A100-40", "A100-40"))  # not asked for
    configmap = results.collect(render(tmp_path), need, "sailplan-system", "x")
    assert configmap["metadata"]["annotations"][results.KEY_ANNOTATION] == need.key
    found, problems = parse_profile_configmaps([configmap])
    assert problems == []
    assert sorted(p.measure for p in found.network) == ["allreduce", "concurrent", "p2p"]
    # once stored, the need is gone
    assert need.key not in keys(found)


def test_zone_pair_results_keep_both_directions_of_that_pair_only(tmp_path: Path) -> None:
    need = _zone_a_to_west()
    for measure in ("p2p", "concurrent"):
        write_profile(
            tmp_path, zone_network("inter-region", A, "A100-40", WEST, "V100-16", 1, measure)
        )
        write_profile(
            tmp_path, zone_network("inter-region", WEST, "V100-16", A, "A100-40", 1, measure)
        )
    write_profile(tmp_path, zone_network("inter-region", B, "A100-40", WEST, "V100-16", 1))
    write_profile(tmp_path, network("inter-region", "A100-40", "V100-16", gpus_per_node=1))
    configmap = results.collect(render(tmp_path), need, "sailplan-system", "x")
    assert configmap["metadata"]["annotations"][results.KEY_ANNOTATION] == need.key
    found, problems = parse_profile_configmaps([configmap])
    assert problems == []
    # another zone pair and a class-wide curve were not asked for
    assert sorted((p.measure, p.zone, p.peer_zone) for p in found.network) == [
        ("concurrent", A, WEST),
        ("concurrent", WEST, A),
        ("p2p", A, WEST),
        ("p2p", WEST, A),
    ]
    assert need.key not in keys(found)
    assert f"network/inter-region/{B}/A100-40/{WEST}/V100-16/n1" in keys(found)


def test_a_log_without_results_is_a_clear_error() -> None:
    need = _needs(ComputeNeed)[0]
    with pytest.raises(results.ProfilingResultError, match="no profile block"):
        results.collect("Traceback ...\nCUDA error\n", need, "ns", "x")


def _job(name: str, need: Any, rank: int | None = None, **status_fields: Any) -> dict[str, Any]:
    labels = {jobs.LABEL_NEED: need_id(need)}
    if rank is not None:
        labels[jobs.LABEL_RANK] = str(rank)
    return {"metadata": {"name": name, "labels": labels}, "status": status_fields}


COMPLETE = {"conditions": [{"type": "Complete", "status": "True"}]}
DEADLINE = {
    "conditions": [
        {
            "type": "Failed",
            "status": "True",
            "reason": "DeadlineExceeded",
            "message": "Job was active longer than specified deadline",
        }
    ]
}


def test_profiling_status_from_job_states() -> None:
    compute_a100, compute_v100 = _needs(ComputeNeed)
    pair = next(n for n in _needs(NetworkNeed) if n.link == "inter-zone")
    inside = next(n for n in _needs(NetworkNeed) if n.link == "intra-node")
    observed = [
        status.observed_job(_job("c1", compute_a100, **COMPLETE)),
        status.observed_job(_job("c2", compute_v100, active=1)),
        # Only rank 0 of the pair finished: the pair is still running.
        status.observed_job(_job("p0", pair, 0, **COMPLETE)),
        status.observed_job(_job("p1", pair, 1, active=1)),
        status.observed_job({"metadata": {"name": "unrelated", "labels": {}}}),
    ]
    found = status.profiling_status(
        [compute_a100, compute_v100, pair, inside], [j for j in observed if j is not None]
    )
    assert found.done == (compute_a100.key,)
    assert found.running == (compute_v100.key, pair.key)
    assert found.pending == (inside.key,)
    assert found.condition(3).status == "True" and found.condition(3).reason == "ProfilingRunning"


def test_a_failed_profiling_job_sets_a_condition_with_its_reason() -> None:
    compute_a100 = _needs(ComputeNeed)[0]
    failed = status.observed_job(_job("opt-prof-abc", compute_a100, **DEADLINE))
    assert failed is not None
    condition = status.profiling_status([compute_a100], [failed]).condition(2)
    assert (condition.status, condition.reason) == ("False", status.REASON_PROFILING_FAILED)
    assert "opt-prof-abc" in condition.message and "DeadlineExceeded" in condition.message


TINY = ModelSpec(
    name="tiny",
    family="opt",
    hidden_size=32,
    num_blocks=2,
    num_heads=4,
    vocab_size=64,
    sequence_length=16,
)


@pytest.mark.slow
def test_the_rendered_command_feeds_the_store_end_to_end(job: TrainingJob, tmp_path: Path) -> None:
    # The compute Job's two containers run here on the CPU, exactly as rendered (mount paths
    # mapped to tmp_path): the real profiler writes files, the report container prints
    # them, and collect() turns the log into a ConfigMap the store reader accepts.
    one_gpu = pool("small", "small", {A: 1}, gpus_per_node=1)
    (need,) = [
        n
        for n in missing_profiles(TINY, 2, build_snapshot([one_gpu]), ProfileSet())
        if isinstance(n, ComputeNeed)
    ]
    rendered = jobs.render_compute_job(job, need, one_gpu)
    template = rendered["spec"]["template"]
    model_file = tmp_path / "model.json"
    model_file.write_text(template["metadata"]["annotations"][jobs.MODEL_ANNOTATION])
    out = tmp_path / "results"
    mapping = {jobs.RESULTS_DIR: str(out), f"{jobs.MODEL_DIR}/model.json": str(model_file)}

    def local(command: list[str]) -> list[str]:
        return [mapping.get(arg, arg) for arg in command]

    (profiler,) = template["spec"]["initContainers"]
    (report,) = template["spec"]["containers"]
    profile_cmd = local(profiler["command"])
    # The console script of the image is this interpreter's module entry point here.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from sailplan.trainer.profilers.cli import main; main()",
            *profile_cmd[1:],
        ],
        check=True,
        capture_output=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    report_cmd = local(report["command"])
    log = subprocess.run(
        [sys.executable, *report_cmd[1:]], check=True, capture_output=True, text=True
    ).stdout
    configmap = results.collect(log, need, "sailplan-system", "team-a/opt")
    found, problems = parse_profile_configmaps([configmap])
    assert problems == []
    # One measured profile per (TP, micro-batch) of the need's grid: TP 1 x mbs 1, 2.
    assert sorted((p.tensor_parallel, p.micro_batch_size) for p in found.compute) == [
        (1, 1),
        (1, 2),
    ]
    assert all(p.provenance.source == "measured" for p in found.compute)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow
def test_a_zone_pairs_rendered_jobs_measure_both_directions_into_the_store(
    job: TrainingJob, tmp_path: Path
) -> None:
    # The two rank Jobs of a pair of zones run here as two processes (gloo on the CPU),
    # with the rendered commands and env (rank 0's DNS name mapped to localhost, messages
    # capped at 1 MiB to keep it short): rank 0's report becomes a ConfigMap that meets
    # the need, with each direction filed under its sender's zone.
    one_gpu = pool("small", "small", {A: 1, B: 1}, gpus_per_node=1)
    (need,) = [
        n
        for n in missing_profiles(TINY, 2, build_snapshot([one_gpu]), ProfileSet())
        if isinstance(n, NetworkNeed) and n.zone_pair
    ]
    _, rank0, rank1 = jobs.render_network_objects(job, need, {"small": one_gpu})
    port = str(_free_port())
    runs = []
    for rank, rendered in enumerate((rank0, rank1)):
        (profiler,) = rendered["spec"]["template"]["spec"]["initContainers"]
        out = tmp_path / f"r{rank}"
        command = [str(out) if arg == jobs.RESULTS_DIR else arg for arg in profiler["command"]]
        env = {e["name"]: e["value"] for e in profiler["env"]}
        env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "GLOO_SOCKET_IFNAME": "lo"}
        runs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from sailplan.trainer.profilers.cli import main; main()",
                    *command[1:],
                    *("--max-bytes", str(2**20), "--repeats", "1"),
                ],
                env=env | {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    for run in runs:
        output, _ = run.communicate(timeout=600)
        assert run.returncode == 0, output.decode()[-2000:]
    log = render(tmp_path / "r0")
    configmap = results.collect(log, need, "sailplan-system", "team-a/opt")
    found, problems = parse_profile_configmaps([configmap])
    assert problems == []
    directions = {(p.measure, p.zone, p.peer_zone) for p in found.network}
    assert {("p2p", A, B), ("p2p", B, A), ("concurrent", A, B), ("concurrent", B, A)} <= directions
    assert need.key not in [
        n.key for n in missing_profiles(TINY, 2, build_snapshot([one_gpu]), found)
    ]
