"""The package mapping in pyproject.toml must list every sub-package of the code directories.

setuptools is given an explicit package list (package-dir maps `planner/` to
`sailplan.planner`, etc.), so a new sub-package that is not listed would work in an editable
checkout and be missing from the wheel. This test catches that.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found: set[str] = set()
    for package, directory in config["package-dir"].items():
        for init in (ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / directory)
            found.add(".".join((package, *relative.parts)))
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - found == set(), "these listed packages have no __init__.py"


def test_no_top_level_directory_shadows_a_module_name() -> None:
    # `operator` is a standard-library module: the code directories must not be importable
    # under their own names, only as sailplan.*.
    import operator

    assert not hasattr(operator, "__path__"), "stdlib operator was shadowed by the repo directory"
