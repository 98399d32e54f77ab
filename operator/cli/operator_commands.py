"""`sailplan crds`, `sailplan operator run` and `sailplan profiles import`.

Thin edge: options in, one-line errors with exit code 2 out; the work is in
sailplan.operator.api.crd (CRD rendering), sailplan.operator.controller (the operator),
sailplan.operator.leader_election (running it only while this replica holds the Lease) and
sailplan.operator.profiling.importing (the profile store import).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

operator_app = typer.Typer(help="Run the Kubernetes operator.", no_args_is_help=True)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def crds_command(
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="write one file per CRD here (e.g. crds/)"),
    ] = None,
) -> None:
    """Render the CRDs from the pydantic models (to stdout, or into a directory)."""
    from sailplan.operator.api import crd

    if output_dir is None:
        files = crd.rendered_files()
        typer.echo(
            "---\n".join(v for k, v in sorted(files.items()) if k != "kustomization.yaml"),
            nl=False,
        )
        return
    for path in crd.write(output_dir):
        typer.echo(f"wrote {path}")


@operator_app.command("run")
def run_command(  # noqa: PLR0917 (typer maps each parameter to an option)
    namespace: Annotated[
        list[str] | None,
        typer.Option(
            "--namespace", "-n", help="serve TrainingJobs of this namespace (repeat); default all"
        ),
    ] = None,
    profile_namespace: Annotated[
        str,
        typer.Option(
            help="namespace of the profile store ConfigMaps", envvar="SAILPLAN_PROFILE_NAMESPACE"
        ),
    ] = "sailplan-system",
    kubeconfig: Annotated[
        Path | None, typer.Option(help="kubeconfig (default: $KUBECONFIG, else in-cluster)")
    ] = None,
    metrics_port: Annotated[int, typer.Option(help="Prometheus metrics port (0 = off)")] = 9090,
    health_port: Annotated[int, typer.Option(help="liveness endpoint port (0 = off)")] = 8080,
    catalog_file: Annotated[
        Path | None, typer.Option("--catalog", help="YAML merged over the built-in catalog")
    ] = None,
    log_format: Annotated[str, typer.Option(help="json or plain")] = "json",
    progress_seconds: Annotated[
        float,
        typer.Option(
            min=1,
            help="seconds between reads of every running job's rank 0 metrics endpoint "
            "(status.progress)",
        ),
    ] = 10.0,
    verbose: Annotated[bool, typer.Option(help="debug logging")] = False,
    resync_seconds: Annotated[
        float,
        typer.Option(
            min=1,
            help="seconds between level-triggered passes over every job and pool (a missed "
            "event's safety net)",
        ),
    ] = 60.0,
    restart_pod_start_seconds: Annotated[
        float,
        typer.Option(
            min=0, help="replan cost model: seconds to schedule, start and rendezvous new pods"
        ),
    ] = 90.0,
    restart_teardown_seconds: Annotated[
        float,
        typer.Option(min=0, help="replan cost model: seconds to tear pods down after a checkpoint"),
    ] = 15.0,
    scale_up_backoff_seconds: Annotated[
        int,
        typer.Option(
            min=1,
            envvar="SAILPLAN_SCALE_UP_BACKOFF_SECONDS",
            help="seconds an autoscaled GPUPool zone whose workers got no node within "
            "provisioningTimeoutSeconds counts no new nodes, doubling on each new failure "
            "(the cluster autoscaler's initial-node-group-backoff-duration)",
        ),
    ] = 300,
    max_scale_up_backoff_seconds: Annotated[
        int,
        typer.Option(
            min=1,
            envvar="SAILPLAN_MAX_SCALE_UP_BACKOFF_SECONDS",
            help="the longest that backoff grows to (the cluster autoscaler's "
            "max-node-group-backoff-duration)",
        ),
    ] = 1800,
    leader_elect: Annotated[
        bool,
        typer.Option(
            help="run only while holding the leader-election Lease (several replicas); "
            "the Deployment turns it on"
        ),
    ] = False,
    lease_name: Annotated[str, typer.Option(help="leader-election Lease name")] = (
        "sailplan-operator"
    ),
    lease_namespace: Annotated[
        str,
        typer.Option(
            help="leader-election Lease namespace (the operator's own)", envvar="POD_NAMESPACE"
        ),
    ] = "sailplan-system",
    lease_duration: Annotated[
        int, typer.Option(min=1, help="seconds a standby waits before taking over a silent leader")
    ] = 15,
    renew_deadline: Annotated[
        float, typer.Option(help="seconds a leader may fail to renew before it exits")
    ] = 10.0,
    retry_period: Annotated[
        float, typer.Option(help="seconds between Lease renewals and acquisition attempts")
    ] = 2.0,
) -> None:
    """Run the operator until interrupted (what the operator Deployment runs)."""
    import kopf

    from sailplan.operator import metrics
    from sailplan.operator.controller import OperatorConfig, build_registry
    from sailplan.operator.leader import Timings
    from sailplan.operator.leader_election import LeaseElector, default_identity, run_while_leading
    from sailplan.operator.reconcile.scaleup import BackoffPolicy
    from sailplan.operator.replan.cost import RestartCostModel
    from sailplan.operator.replan.decision import ReplanConfig
    from sailplan.planner.catalog import CatalogError, default_catalog, load_catalog

    if log_format not in ("json", "plain"):
        raise _fail(f"--log-format must be json or plain, not {log_format!r}")
    if kubeconfig is not None and not kubeconfig.exists():
        raise _fail(f"no kubeconfig at {kubeconfig}")
    try:
        timings = Timings(lease_duration, renew_deadline, retry_period)
    except ValueError as error:
        raise _fail(str(error)) from error
    try:
        scale_up_backoff = BackoffPolicy(scale_up_backoff_seconds, max_scale_up_backoff_seconds)
    except ValueError as error:
        raise _fail(f"--max-scale-up-backoff-seconds: {error}") from error
    try:
        catalog = load_catalog(catalog_file) if catalog_file else default_catalog()
    except (CatalogError, OSError) as error:
        raise _fail(str(error)) from error
    api_client = _api_client(kubeconfig)
    config = OperatorConfig(
        catalog=catalog,
        namespaces=tuple(namespace or ()),
        profile_namespace=profile_namespace,
        metrics_port=None if leader_elect else metrics_port or None,
        progress_seconds=progress_seconds,
        resync_seconds=resync_seconds,
        replan=ReplanConfig(
            restart=RestartCostModel(
                teardown_seconds=restart_teardown_seconds,
                pod_start_seconds=restart_pod_start_seconds,
            )
        ),
        scale_up_backoff=scale_up_backoff,
    )
    kopf.configure(
        verbose=verbose,
        log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL,
    )
    if not verbose:
        # Kopf logs every handler invocation at INFO; with watch events on hundreds of nodes
        # and pods that drowns the operator's own decisions.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("kopf.activities").setLevel(logging.WARNING)
    if leader_elect and metrics_port:
        # Served from the start, so a standby reports sailplan_operator_leader 0 too.
        metrics.serve(metrics_port)
    registry = build_registry(config, api_client)

    def operate() -> None:
        # Kopf's own peering stays off: the Lease decides who runs.
        kopf.run(
            registry=registry,
            clusterwide=True,
            standalone=True,
            liveness_endpoint=f"http://0.0.0.0:{health_port}/healthz" if health_port else None,
        )

    if not leader_elect:
        operate()
        return
    elector = LeaseElector(
        api_client, lease_namespace, lease_name, identity=default_identity(), timings=timings
    )
    run_while_leading(elector, operate, health_port or None)


def _api_client(kubeconfig: Path | None) -> ApiClient:
    """A client for --kubeconfig, else $KUBECONFIG, else the in-cluster service account,
    writing as the operator's field manager."""
    from kubernetes import client, config

    from sailplan.operator.kube import as_field_manager

    path = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    try:
        if path:
            api: ApiClient = config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
            return as_field_manager(api)
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return as_field_manager(client.ApiClient(configuration))
    except (config.ConfigException, OSError) as error:
        raise _fail(f"no Kubernetes credentials: {error}") from error


profiles_app = typer.Typer(help="Manage the operator's profile store.", no_args_is_help=True)


@profiles_app.command("import")
def profiles_import_command(
    directory: Annotated[
        Path, typer.Argument(help="profile directory (sailplan layout or a Sailor artifact)")
    ],
    namespace: Annotated[
        str,
        typer.Option(
            "--namespace",
            "-n",
            help="namespace of the profile store (the operator's --profile-namespace)",
            envvar="SAILPLAN_PROFILE_NAMESPACE",
        ),
    ] = "sailplan-system",
    kubeconfig: Annotated[
        Path | None, typer.Option(help="kubeconfig (default: $KUBECONFIG, else in-cluster)")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the ConfigMaps as YAML, write nothing")
    ] = False,
) -> None:
    """Load measured profiles into the profile store, so no TrainingJob profiles them again."""
    import yaml
    from kubernetes.client.exceptions import ApiException

    from sailplan.operator.kube import Kube
    from sailplan.operator.profiling.importing import import_configmaps
    from sailplan.planner.profiles.store import ProfileStoreError, load_profile_dir

    if not directory.is_dir():
        raise _fail(f"no profile directory at {directory}")
    if kubeconfig is not None and not kubeconfig.exists():
        raise _fail(f"no kubeconfig at {kubeconfig}")
    try:
        profiles = load_profile_dir(directory)
    except (ProfileStoreError, OSError) as error:
        raise _fail(str(error)) from error
    batch = import_configmaps(profiles, namespace, directory.resolve().name)
    if not batch.configmaps:
        raise _fail(f"{directory} holds no measured profile ({batch.skipped_estimated} estimated)")
    summary = (
        f"{batch.imported} measured profiles in {len(batch.configmaps)} ConfigMaps "
        f"(namespace {namespace}; {batch.skipped_estimated} estimated skipped)"
    )
    if dry_run:
        typer.echo(yaml.safe_dump_all(batch.configmaps, sort_keys=False), nl=False)
        typer.echo(f"dry run: would write {summary}", err=True)
        return
    kube = Kube(_api_client(kubeconfig))
    created = 0
    try:
        for configmap in batch.configmaps:
            created += kube.put_configmap(configmap)
    except ApiException as error:
        raise _fail(f"writing the profile store failed: {error.status} {error.reason}") from error
    typer.echo(f"imported {summary}: {created} created, {len(batch.configmaps) - created} replaced")


def register(app: typer.Typer) -> None:
    app.command("crds")(crds_command)
    app.add_typer(operator_app, name="operator")
    app.add_typer(profiles_app, name="profiles")
