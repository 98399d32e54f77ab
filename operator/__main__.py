"""`python -m sailplan.operator ...`: the operator's own commands (crds, operator run, profiles).

The demo and the tests spawn the operator this way: it does not depend on the console
script being on PATH, nor on every other subsystem's commands importing cleanly.
"""

import typer

from sailplan.operator.cli.operator_commands import register

app = typer.Typer(
    name="sailplan-operator",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
register(app)
app()
