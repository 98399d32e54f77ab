"""`python -m sailplan.operator.nodeagent`: the node agent's command (the DaemonSet runs it).

    --node-name NAME        the node it runs on ($NODE_NAME, from the downward API)
    --fake-nvml TYPE:COUNT  simulated GPUs of a catalog type (local cluster, tests)
    --metrics-port PORT     Prometheus metrics (default 9400; 0 = none)
    --interval SECONDS      seconds between passes (default 10)
    --state-file PATH       where it remembers the GPUs it locked (survives a restart)
    --pod-resources-socket  the kubelet's PodResources socket: which GPUs each pod got
                            (default /var/lib/kubelet/pod-resources/kubelet.sock)
    --kubeconfig PATH       else $KUBECONFIG, else the in-cluster service account
    --once                  one pass, then reset what it locked and exit (tests, debugging)

Bad flags and a missing NVML are one line on stderr and exit code 2. SIGTERM resets every
GPU the agent locked before it exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from sailplan.operator.nodeagent.devices import DeviceSource, FakeAllocator
from sailplan.operator.nodeagent.nvml import NVML, FakeNVML, NVMLError, fake_gpus
from sailplan.operator.nodeagent.podresources import SOCKET

log = logging.getLogger("sailplan.nodeagent")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        _fail(message)


def _fail(message: str) -> NoReturn:
    print(f"sailplan-nodeagent: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _fake_spec(text: str) -> tuple[str, int]:
    from sailplan.planner.catalog import CatalogError, default_catalog
    from sailplan.planner.energy import EnergyError, EnergyModel

    gpu_type, _, count = text.partition(":")
    if not count.isdigit() or int(count) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not TYPE:COUNT (e.g. A100-40:4)")
    try:
        catalog = default_catalog()
        EnergyModel(catalog).curve(catalog.resolve_gpu(gpu_type))
    except (CatalogError, EnergyError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return gpu_type, int(count)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be above 0")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return int(text)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="sailplan-nodeagent", description=__doc__.splitlines()[0])
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME", ""))
    parser.add_argument("--fake-nvml", type=_fake_spec, metavar="TYPE:COUNT")
    parser.add_argument("--metrics-port", type=_port, default=9400)
    parser.add_argument("--interval", type=_positive, default=10.0)
    parser.add_argument("--state-file", type=Path)
    parser.add_argument("--pod-resources-socket", default=SOCKET)
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING"])
    args = parser.parse_args(argv)
    if not args.node_name:
        _fail("--node-name (or $NODE_NAME) is required")
    if args.state_file is not None and not args.state_file.parent.is_dir():
        _fail(f"--state-file: directory {args.state_file.parent} does not exist")
    return args


def _api_client(kubeconfig: Path | None) -> Any:
    from kubernetes import client, config

    path = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    try:
        if path:
            return config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)
    except (config.ConfigException, OSError) as error:
        _fail(f"no Kubernetes credentials: {str(error).splitlines()[0]}")


def _nvml(args: argparse.Namespace) -> tuple[NVML, DeviceSource]:
    if args.fake_nvml is not None:
        gpu_type, count = args.fake_nvml
        fake = FakeNVML(gpus=fake_gpus(gpu_type, count, node=args.node_name), now=time.monotonic)
        return fake, FakeAllocator(count)
    from sailplan.operator.nodeagent.nvml import PyNVML
    from sailplan.operator.nodeagent.podresources import PodResourcesDevices

    if not Path(args.pod_resources_socket).exists():
        _fail(
            f"--pod-resources-socket {args.pod_resources_socket} does not exist (mount the "
            "kubelet's /var/lib/kubelet/pod-resources)"
        )
    try:
        real = PyNVML()
    except NVMLError as error:
        _fail(f"NVML: {error}")
    return real, PodResourcesDevices(args.pod_resources_socket)


def main(argv: list[str] | None = None) -> None:
    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    from sailplan.operator.nodeagent.agent import Agent
    from sailplan.operator.nodeagent.kube import KubeView
    from sailplan.operator.nodeagent.metrics import AgentMetrics

    nvml, devices = _nvml(args)
    metrics = AgentMetrics()
    agent = Agent(
        nvml=nvml,
        cluster=KubeView(_api_client(args.kubeconfig), args.node_name),
        devices=devices,
        metrics=metrics,
        state_file=args.state_file,
    )
    if args.metrics_port:
        metrics.serve(args.metrics_port)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("node agent on %s: %d GPU(s)", args.node_name, nvml.device_count())
    try:
        while True:
            try:
                agent.sync()
            except Exception as error:  # the API server or NVML hiccups: retry next pass
                log.warning("pass failed: %s", str(error).splitlines()[0] if str(error) else error)
            if args.once or stop.wait(args.interval):
                break
    finally:
        agent.shutdown()
        log.info("node agent stopped; locked clocks reset")


if __name__ == "__main__":
    main()
