"""Autoscaled zones that do not give nodes: a zone whose waiting workers got no node within
provisioningTimeoutSeconds is backed off (no possible nodes, condition ScaleUpAvailable
False), for 5 min doubling to 30 min (the operator's --scale-up-backoff-seconds and
--max-scale-up-backoff-seconds change both), until a node of the zone becomes Ready;
planning then sees only the nodes that exist."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sailplan.operator.api import gpupool as api
from sailplan.operator.api.common import find_condition
from sailplan.operator.api.gpupool import GPUPool, GPUPoolStatus
from sailplan.operator.reconcile.gpupool import pool_status
from sailplan.operator.reconcile.nodes import NodeInfo, created_at
from sailplan.operator.reconcile.scaleup import BackoffPolicy, next_change
from sailplan.operator.reconcile.snapshot import build_snapshot
from sailplan.planner.catalog import Catalog, default_catalog

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return default_catalog()


def autoscaled(**autoscaling: Any) -> GPUPool:
    limits = {"zones": [ZONE_A, ZONE_B], "machineType": "a2-highgpu-4g", "maxNodesPerZone": 2}
    return GPUPool.model_validate(
        {
            "name": "a100",
            "generation": 1,
            "spec": {"nodePool": "a100", "autoscaling": limits | autoscaling},
        }
    )


def node(name: str, zone: str) -> NodeInfo:
    return NodeInfo(
        name=name,
        labels={api.NODEPOOL_LABEL: "a100", api.ZONE_LABEL: zone},
        ready=True,
        gpus_allocatable=4,
    )


def advance(
    pool: GPUPool,
    catalog: Catalog,
    now: datetime,
    *,
    nodes: list[NodeInfo] | None = None,
    waiting: dict[str, datetime] | None = None,
    policy: BackoffPolicy | None = None,
) -> tuple[GPUPool, GPUPoolStatus]:
    """One status refresh at `now`; the pool carries the written status to the next one."""
    extra = {"backoff_policy": policy} if policy is not None else {}
    status = pool_status(pool, nodes or [], {}, catalog, now, waiting_since=waiting, **extra)
    return pool.model_copy(update={"status": status}), status


def zone(status: GPUPoolStatus, name: str) -> Any:
    return next(z for z in status.zones if z.zone == name)


def test_workers_waiting_less_than_the_timeout_change_nothing(catalog: Catalog) -> None:
    _, status = advance(autoscaled(), catalog, NOW, waiting={ZONE_A: NOW - timedelta(seconds=899)})
    assert zone(status, ZONE_A).nodes_possible == 2
    assert zone(status, ZONE_A).scale_up_backoff_until is None
    condition = find_condition(status.conditions, api.SCALE_UP_AVAILABLE)
    assert condition is not None and condition.status == "True"


def test_a_zone_that_gives_no_node_in_time_counts_no_new_nodes_for_a_backoff(
    catalog: Catalog,
) -> None:
    # 900 s: the cluster autoscaler's default max-node-provision-time
    pool, status = advance(
        autoscaled(), catalog, NOW, waiting={ZONE_A: NOW - timedelta(seconds=900)}
    )
    a, b = zone(status, ZONE_A), zone(status, ZONE_B)
    assert (a.nodes_possible, a.gpus_possible) == (0, 0)
    assert a.scale_up_backoff_until == NOW + timedelta(seconds=300)
    assert a.scale_up_backoff_seconds == 300
    assert (b.nodes_possible, b.scale_up_backoff_until) == (2, None)
    condition = find_condition(status.conditions, api.SCALE_UP_AVAILABLE)
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", api.REASON_SCALE_UP_BACKOFF)
    assert f"{ZONE_A} until 2026-01-01T12:05:00Z (backoff 300 s)" in condition.message
    assert ZONE_B not in condition.message
    # The planner sees nothing in zone a (no node exists, none may come), zone b's two.
    snapshot = build_snapshot([pool])
    assert {p.name: p.obtainable_nodes for p in snapshot.pools} == {f"a100/{ZONE_B}": 2}


def test_the_backoff_holds_until_it_ends_and_doubles_on_each_new_failure_up_to_30_min(
    catalog: Catalog,
) -> None:
    pool = autoscaled(provisioningTimeoutSeconds=600)
    waited = NOW - timedelta(seconds=600)
    pool, status = advance(pool, catalog, NOW, waiting={ZONE_A: waited})
    assert zone(status, ZONE_A).scale_up_backoff_seconds == 300
    # the job replanned away: nothing waits, the backoff still holds
    pool, status = advance(pool, catalog, NOW + timedelta(seconds=299))
    assert zone(status, ZONE_A).nodes_possible == 0
    # over: the zone's nodes count again, the backoff length is remembered
    now = NOW + timedelta(seconds=300)
    pool, status = advance(pool, catalog, now)
    a = zone(status, ZONE_A)
    assert (a.nodes_possible, a.scale_up_backoff_until, a.scale_up_backoff_seconds) == (
        2,
        None,
        300,
    )
    lengths = []
    for _ in range(4):
        # a new plan's workers wait the timeout again without a node
        now += timedelta(seconds=600)
        pool, status = advance(pool, catalog, now, waiting={ZONE_A: now - timedelta(seconds=600)})
        lengths.append(zone(status, ZONE_A).scale_up_backoff_seconds)
        until = zone(status, ZONE_A).scale_up_backoff_until
        assert until is not None
        now = until
    assert lengths == [600, 1200, 1800, 1800]


def test_a_node_of_the_zone_becoming_ready_ends_the_backoff_at_once(catalog: Catalog) -> None:
    pool, status = advance(
        autoscaled(), catalog, NOW, waiting={ZONE_A: NOW - timedelta(seconds=900)}
    )
    assert zone(status, ZONE_A).scale_up_backoff_until is not None
    later = NOW + timedelta(seconds=60)
    pool, status = advance(pool, catalog, later, nodes=[node("a-0", ZONE_A)])
    a = zone(status, ZONE_A)
    assert (a.nodes_ready, a.nodes_possible) == (1, 1)
    assert (a.scale_up_backoff_until, a.scale_up_backoff_seconds) == (None, 0)
    condition = find_condition(status.conditions, api.SCALE_UP_AVAILABLE)
    assert condition is not None and condition.status == "True"


def test_pools_that_never_grow_have_no_scale_up_condition(catalog: Catalog) -> None:
    fixed = GPUPool.model_validate({"name": "a100", "spec": {"nodePool": "a100"}})
    status = pool_status(
        fixed, [node("a-0", ZONE_A)], {}, catalog, NOW, waiting_since={ZONE_A: NOW}
    )
    assert find_condition(status.conditions, api.SCALE_UP_AVAILABLE) is None
    assert zone(status, ZONE_A).scale_up_backoff_until is None


def test_a_timeout_shorter_than_a_minute_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"provisioningTimeoutSeconds|provisioning_timeout_seconds"
    ):
        autoscaled(provisioningTimeoutSeconds=10)


def test_creation_time_of_a_pod_is_read_from_its_metadata() -> None:
    stamp = {"metadata": {"creationTimestamp": "2026-01-01T11:45:00Z"}}
    assert created_at(stamp) == NOW - timedelta(minutes=15)
    assert created_at({"metadata": {"creationTimestamp": "yesterday"}}) is None
    assert created_at({}) is None


def test_the_next_change_is_the_first_backoff_end_or_timeout_still_to_come(
    catalog: Catalog,
) -> None:
    pool, status = advance(
        autoscaled(), catalog, NOW, waiting={ZONE_A: NOW - timedelta(seconds=900)}
    )
    # zone a's backoff ends at NOW + 300; a worker in zone b that started waiting a minute
    # ago reaches the 900 s timeout at NOW + 840
    waiting = {ZONE_B: NOW - timedelta(seconds=60)}
    assert next_change(status.zones, waiting, 900, NOW) == NOW + timedelta(seconds=300)
    later = NOW + timedelta(seconds=400)
    _, status = advance(pool, catalog, later, waiting=waiting)
    assert next_change(status.zones, waiting, 900, later) == NOW + timedelta(seconds=840)
    assert next_change(status.zones, {}, 900, later) is None


def test_the_operators_backoff_setting_sets_the_first_length_and_the_cap(
    catalog: Catalog,
) -> None:
    policy = BackoffPolicy(initial_seconds=10, max_seconds=25)
    pool, now = autoscaled(provisioningTimeoutSeconds=60), NOW
    lengths = []
    for _ in range(4):
        pool, status = advance(
            pool, catalog, now, waiting={ZONE_A: now - timedelta(seconds=60)}, policy=policy
        )
        a = zone(status, ZONE_A)
        assert a.nodes_possible == 0 and a.scale_up_backoff_until is not None
        lengths.append(a.scale_up_backoff_seconds)
        assert a.scale_up_backoff_until == now + timedelta(seconds=a.scale_up_backoff_seconds)
        now = a.scale_up_backoff_until
    assert lengths == [10, 20, 25, 25]
    condition = find_condition(status.conditions, api.SCALE_UP_AVAILABLE)
    assert condition is not None and "(backoff 25 s)" in condition.message


@pytest.mark.parametrize(
    ("initial", "cap", "message"),
    [
        (0, 10, "at least 1 s, not 0"),
        (60, 30, r"maximum scale-up backoff \(30 s\) is below the first backoff \(60 s\)"),
    ],
)
def test_a_backoff_setting_that_makes_no_sense_is_refused(
    initial: int, cap: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        BackoffPolicy(initial, cap)


def _kubeconfig(path: Path) -> Path:
    """A kubeconfig that parses; nothing is served at its address (never contacted here)."""
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return path


def test_operator_run_passes_the_backoff_flags_and_env_to_the_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import typer
    from typer.testing import CliRunner

    from sailplan.operator import controller
    from sailplan.operator.cli.operator_commands import register

    seen: list[Any] = []

    def stop_here(config: Any, api_client: Any) -> Any:
        seen.append(config.scale_up_backoff)
        raise typer.Exit(code=0)

    monkeypatch.setattr(controller, "build_registry", stop_here)
    app = typer.Typer()
    register(app)
    args = ["operator", "run", f"--kubeconfig={_kubeconfig(tmp_path / 'kubeconfig')}"]
    runner = CliRunner()
    assert runner.invoke(app, args).exit_code == 0
    flags = ["--scale-up-backoff-seconds=15", "--max-scale-up-backoff-seconds=40"]
    assert runner.invoke(app, [*args, *flags]).exit_code == 0
    env = {"SAILPLAN_SCALE_UP_BACKOFF_SECONDS": "7", "SAILPLAN_MAX_SCALE_UP_BACKOFF_SECONDS": "9"}
    assert runner.invoke(app, args, env=env).exit_code == 0
    assert seen == [BackoffPolicy(300, 1800), BackoffPolicy(15, 40), BackoffPolicy(7, 9)]


def test_operator_run_refuses_a_backoff_cap_below_the_first_backoff_with_exit_code_2(
    tmp_path: Path,
) -> None:
    import typer
    from typer.testing import CliRunner

    from sailplan.operator.cli.operator_commands import register

    app = typer.Typer()
    register(app)
    refused = CliRunner().invoke(
        app,
        [
            "operator",
            "run",
            f"--kubeconfig={_kubeconfig(tmp_path / 'kubeconfig')}",
            "--scale-up-backoff-seconds=60",
            "--max-scale-up-backoff-seconds=30",
        ],
    )
    assert refused.exit_code == 2
    assert refused.output.strip().splitlines() == [
        "error: --max-scale-up-backoff-seconds: the maximum scale-up backoff (30 s) is below "
        "the first backoff (60 s)"
    ]
