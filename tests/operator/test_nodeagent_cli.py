"""`python -m sailplan.operator.nodeagent`: bad flags are one line and exit code 2."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sailplan.operator.nodeagent.__main__ import parse


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--node-name", "n", "--interval", "soon"], "'soon' is not a number"),
        (["--node-name", "n", "--interval", "0"], "must be above 0"),
        (["--node-name", "n", "--fake-nvml", "A100-40"], "is not TYPE:COUNT"),
        (["--node-name", "n", "--fake-nvml", "Z100:4"], "unknown GPU type 'Z100'"),
        (["--node-name", "n", "--metrics-port", "70000"], "is not a port"),
        (["--node-name", "n", "--state-file", "/no/such/dir/x.json"], "does not exist"),
        (["--node-name", "n", "--colour"], "unrecognized arguments: --colour"),
        (["--node-name", ""], "--node-name (or $NODE_NAME) is required"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    argv: list[str],
    expected: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(SystemExit) as exited:
        parse(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sailplan-nodeagent: error: ")
    assert expected in err


def test_good_flags_parse_and_the_node_name_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODE_NAME", "gke-a100-a-0")
    args = parse(["--fake-nvml", "nvidia-tesla-a100:4", "--interval", "2.5"])
    assert args.node_name == "gke-a100-a-0"
    assert args.fake_nvml == ("nvidia-tesla-a100", 4)
    assert args.interval == 2.5


def test_the_module_entry_point_reports_missing_credentials_in_one_line(tmp_path: object) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sailplan.operator.nodeagent",
            "--node-name",
            "n",
            "--fake-nvml",
            "A100-40:2",
            "--kubeconfig",
            "/no/such/kubeconfig",
            "--metrics-port",
            "0",
            "--once",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("sailplan-nodeagent: error: no Kubernetes credentials")
    )


@pytest.fixture
def root_logger_restored() -> Iterator[None]:
    """main() configures the root logger with a handler on this test's captured stderr,
    which pytest closes afterwards: later tests' log lines would hit a closed stream."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("root_logger_restored")
def test_real_gpus_without_the_kubelets_socket_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sailplan.operator.nodeagent.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["--node-name", "n", "--pod-resources-socket", "/no/such/kubelet.sock"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--pod-resources-socket /no/such/kubelet.sock does not exist" in err
