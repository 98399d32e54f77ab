"""Packaging guards: the package mapping in pyproject.toml, and no shadowing of the stdlib.

setuptools is given an explicit package list (package-dir maps `planner/` to
`sailplan.planner`, etc.), so a new sub-package that is not listed would work in an editable
checkout and be missing from the wheel. The three code directories themselves have no
`__init__.py`: they are namespace portions of `sailplan`, so from the repository root
`import operator` still finds the standard library (a regular package named `operator`
there broke `python3 -m venv .venv` in a fresh clone).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setuptools_config() -> dict[str, object]:
    config: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]
    return config


def test_every_subpackage_is_listed_in_pyproject() -> None:
    config = _setuptools_config()
    listed = set(config["packages"])  # type: ignore[call-overload]
    package_dir: dict[str, str] = config["package-dir"]  # type: ignore[assignment]
    found: set[str] = set(package_dir)
    for package, directory in package_dir.items():
        for init in (ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / directory)
            found.add(".".join((package, *relative.parts)))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - found == set(), "these listed packages have no __init__.py"


def test_code_directories_are_not_regular_packages() -> None:
    package_dir: dict[str, str] = _setuptools_config()["package-dir"]  # type: ignore[assignment]
    regular = [d for d in package_dir.values() if (ROOT / d / "__init__.py").exists()]
    assert regular == [], f"{regular} would be importable from the repository root"


def test_stdlib_operator_wins_from_the_repository_root() -> None:
    # -S: no site packages, so no .pth file imports `operator` before the current directory
    # is on sys.path; exactly the situation of `python3 -m venv .venv` in a fresh clone.
    completed = subprocess.run(
        [sys.executable, "-S", "-c", "import operator; print(operator.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert not completed.stdout.strip().startswith(str(ROOT)), completed.stdout


def test_development_package_lists_its_subpackages() -> None:
    dev = ROOT / "dev"
    config = tomllib.loads((dev / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {
        ".".join(init.parent.relative_to(dev).parts)
        for init in (dev / "sailplan_dev").rglob("__init__.py")
    }
    assert set(config["packages"]) == found


def test_product_carries_no_development_code() -> None:
    """The local cluster, its kubelet emulator and the demo live in sailplan-dev: neither the
    product wheel (its explicit package list), its dependencies, nor the operator image (what
    the Dockerfile copies) may hold them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    package_dir: dict[str, str] = _setuptools_config()["package-dir"]  # type: ignore[assignment]
    assert not any(d.startswith("dev") for d in package_dir.values())
    listed: list[str] = _setuptools_config()["packages"]  # type: ignore[assignment]
    assert not [p for p in listed if "localcluster" in p or "dev" in p.split(".")]
    requirements = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        requirements += extra
    # cryptography was needed only by the pod runner's TLS log endpoint.
    assert not [r for r in requirements if r.startswith(("cryptography", "pytest", "ruff"))]
    copied = [
        line.split()[1]
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from" not in line
    ]
    assert copied and not [c for c in copied if c.startswith("dev")]
