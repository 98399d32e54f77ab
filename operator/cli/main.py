"""The `sailplan` command: one typer app that mounts each subsystem's commands.

It lives in the operator package because the operator is the top layer (it may import the
planner; the planner may not import it). Each subsystem owns its own commands:
`sailplan plan` / `sailplan simulate` (sailplan.planner.cli), `sailplan cluster ...`
(local control plane), `sailplan crds`, `sailplan demo`, `sailplan profiles ...` (operator).
Registration is lazy-tolerant: a subsystem whose optional dependencies are missing simply
does not add its commands, so `pip install sailplan` (planner only) still gives plan/simulate.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="sailplan",
    help="Plan and run large-model training on heterogeneous, dynamic GPU clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# (module, attribute) pairs; each attribute is a function `register(app: typer.Typer) -> None`.
_SUBSYSTEMS: tuple[tuple[str, str], ...] = (
    ("sailplan.planner.cli", "register"),
    ("sailplan.operator.cli.cluster", "register"),
    ("sailplan.operator.cli.operator_commands", "register"),
)


def _register_subsystems() -> None:
    for module_name, attribute in _SUBSYSTEMS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # Only tolerate a missing optional dependency or a not-yet-written module, never a
            # bug inside a module that exists.
            if error.name and (error.name == module_name or not error.name.startswith("sailplan")):
                continue
            raise
        getattr(module, attribute)(app)


_register_subsystems()


def main() -> None:
    app()
