"""The `sailplan` command: one typer app that mounts each subsystem's commands.

It lives in the operator package because the operator is the top layer (it may import the
planner; the planner may not import it). Each subsystem owns its own commands:
`sailplan plan` / `sailplan simulate` (sailplan.planner.cli), `sailplan crds`,
`sailplan operator run` and `sailplan profiles ...` (sailplan.operator.cli.operator_commands).
Other distributions add commands through the `sailplan.commands` entry-point group (the
development package adds `sailplan cluster ...` and `sailplan demo` that way), so the product
never imports them. Registration is lazy-tolerant: a subsystem whose optional dependencies are
missing simply does not add its commands, so `pip install sailplan` (planner only) still gives
plan/simulate.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

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
    ("sailplan.operator.cli.operator_commands", "register"),
)
PLUGIN_GROUP = "sailplan.commands"


def _tolerated(error: ModuleNotFoundError, module_name: str) -> bool:
    """A missing optional dependency or a not-yet-written module, never a bug inside a
    module that exists."""
    name = error.name or ""
    return bool(name) and (name == module_name or not name.startswith("sailplan"))


def _register_subsystems() -> None:
    for module_name, attribute in _SUBSYSTEMS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if _tolerated(error, module_name):
                continue
            raise
        getattr(module, attribute)(app)
    for plugin in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            register = plugin.load()
        except ModuleNotFoundError as error:
            if _tolerated(error, plugin.module):
                continue
            raise
        register(app)


_register_subsystems()


def main() -> None:
    app()
