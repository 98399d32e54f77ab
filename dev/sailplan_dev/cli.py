"""`sailplan cluster build|up|down|env|status` and `sailplan demo`: the development commands.

They are not part of the product: the `sailplan` command of the product loads them through
the `sailplan.commands` entry point that this distribution (sailplan-dev) declares, so they
exist only where the development package is installed. Thin edge over
sailplan_dev.localcluster and sailplan_dev.demo: parses options, turns their errors into
one-line messages with exit code 2, prints what happened and how long it took.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from kubernetes.client import ApiException

from sailplan_dev.localcluster import build, kwokctl
from sailplan_dev.localcluster.cluster import DEFAULT_NAME, ClusterError, LocalCluster
from sailplan_dev.localcluster.kubeconfig import export_line, server
from sailplan_dev.localcluster.nodes import NodeFileError, load_node_file

cluster_app = typer.Typer(
    help="A real local Kubernetes control plane (etcd, API server, scheduler, controller "
    "manager, kwok) with GKE-like fake GPU nodes. No Docker needed.",
    no_args_is_help=True,
)

NameOption = Annotated[str, typer.Option("--name", help="cluster name (several may coexist)")]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


@cluster_app.command("build")
def build_command(
    jobs: Annotated[
        int, typer.Option(help="parallel Go compile jobs (0 = every CPU this process may use)")
    ] = 0,
) -> None:
    """Build etcd, kube-*, kubectl, kwok, helm and Karpenter from their Go modules (cached)."""
    start = time.monotonic()
    try:
        results = build.build(log=lambda m: typer.echo(m, err=True), jobs=jobs or None)
    except build.GoToolchainMissingError as error:
        raise _fail(f"{error}; install Go >= 1.26 to build the local cluster") from error
    except build.BuildError as error:
        raise _fail(str(error)) from error
    built = [r.group for r in results if r.built]
    typer.echo(
        f"binaries in {build.bin_dir()} ({', '.join(built) or 'nothing'} built) "
        f"in {time.monotonic() - start:.0f}s"
    )


@cluster_app.command("up")
def up_command(
    nodes: Annotated[
        Path | None, typer.Option("--nodes", help="node file (YAML); default: GKE-like pools")
    ] = None,
    name: NameOption = DEFAULT_NAME,
) -> None:
    """Start the cluster (or reuse it), create its nodes, wait until they are Ready."""
    start = time.monotonic()
    try:
        node_file = load_node_file(nodes)
        cluster = LocalCluster.up(node_file, name=name, log=lambda m: typer.echo(m, err=True))
    except (ClusterError, NodeFileError) as error:
        raise _fail(str(error)) from error
    except ApiException as error:
        # E.g. a node of the file clashes with one an admission webhook rejects.
        raise _fail(f"API server refused a request: {error.status} {error.reason}") from error
    typer.echo(
        f"cluster {name} up at {server(cluster.kubeconfig)} with {node_file.node_count} nodes "
        f"in {time.monotonic() - start:.1f}s"
    )
    typer.echo(f'use it: eval "$(sailplan cluster env --name {name})"')


@cluster_app.command("down")
def down_command(name: NameOption = DEFAULT_NAME) -> None:
    """Stop the cluster's processes and delete its state."""
    if not kwokctl.exists(name):
        typer.echo(f"cluster {name} is not running")
        return
    start = time.monotonic()
    try:
        LocalCluster(name, kwokctl.kubeconfig_path(name)).down()
    except ClusterError as error:
        raise _fail(str(error)) from error
    typer.echo(f"cluster {name} deleted in {time.monotonic() - start:.1f}s")


@cluster_app.command("env")
def env_command(name: NameOption = DEFAULT_NAME) -> None:
    """Print `export KUBECONFIG=...` for the cluster: eval "$(sailplan cluster env)"."""
    if not kwokctl.exists(name):
        raise _fail(f"cluster {name} does not exist: run `sailplan cluster up --name {name}`")
    typer.echo(export_line(kwokctl.kubeconfig_path(name)))


@cluster_app.command("status")
def status_command(name: NameOption = DEFAULT_NAME) -> None:
    """Is the cluster up, where is it, how many nodes are Ready."""
    missing = build.missing_binaries()
    if missing:
        typer.echo(f"binaries: missing {', '.join(missing)} (run `sailplan cluster build`)")
    else:
        typer.echo(f"binaries: {build.bin_dir()} (Kubernetes {build.K8S_VERSION})")
    others = [c for c in kwokctl.list_clusters() if c != name]
    if others:
        typer.echo(f"other clusters: {', '.join(others)}")
    if not kwokctl.exists(name):
        typer.echo(f"cluster {name}: not created")
        raise typer.Exit(code=1)
    cluster = LocalCluster(name, kwokctl.kubeconfig_path(name))
    if not cluster.healthy():
        typer.echo(f"cluster {name}: created but the API server is not answering")
        raise typer.Exit(code=1)
    nodes = cluster.core.list_node().items
    ready = sum(
        any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or ())
        for n in nodes
    )
    typer.echo(f"cluster {name}: up at {server(cluster.kubeconfig)}")
    typer.echo(f"nodes: {ready}/{len(nodes)} Ready")
    typer.echo(f"kubeconfig: {cluster.kubeconfig}")


def demo_command(
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="default: the `sailplan cluster up` cluster, else $KUBECONFIG"),
    ] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for Running")] = 180.0,
    keep_operator: Annotated[
        bool, typer.Option(help="leave the operator running in the foreground afterwards")
    ] = False,
    preempt: Annotated[
        bool,
        typer.Option(
            help="then preempt a spot node of the plan (local cluster) and show the replan"
        ),
    ] = False,
    autoscale: Annotated[
        bool,
        typer.Option(help="plan on a GPUPool at zero nodes that Karpenter grows (local cluster)"),
    ] = False,
) -> None:
    """Install the CRDs, start the operator, apply the examples and show where pods landed."""
    from sailplan_dev.demo import DemoError, run_demo

    try:
        run_demo(
            kubeconfig=kubeconfig,
            timeout_s=timeout,
            keep_operator=keep_operator,
            preempt=preempt,
            autoscale=autoscale,
        )
    except DemoError as error:
        raise _fail(str(error)) from error


def register(app: typer.Typer) -> None:
    """Entry point `sailplan.commands: dev`: mounts the development commands on `sailplan`."""
    app.add_typer(cluster_app, name="cluster")
    app.command("demo")(demo_command)
