"""The body of one planning worker process (started by sailplan.operator.planning).

Kept apart from the service so the child imports only the planner: no Kopf, no Kubernetes
client, no copy of the operator's caches. The answer goes back over a pipe as
("ok", PlanResult) or ("error", one line); a process that dies without sending either is
reported by the service as a crash.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

from sailplan.planner.api import PlanRequest, make_plan
from sailplan.planner.catalog import Catalog
from sailplan.planner.profiles.types import ProfileSet


def run_search(
    request: PlanRequest, measured: ProfileSet, catalog: Catalog, answer: Connection
) -> None:
    try:
        result = make_plan(request, measured, catalog)
    except Exception as error:  # any planner bug becomes a reported failure, not a hang
        first_line = (str(error).splitlines() or [""])[0]
        answer.send(("error", f"{type(error).__name__}: {first_line}"))
    else:
        answer.send(("ok", result))
    finally:
        answer.close()
