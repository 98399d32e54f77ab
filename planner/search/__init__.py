"""The planner's search: the best parallel plan (and top-k alternatives) for a request.

`plan(request, profiles, catalog)` expects completed profiles (measured plus estimates);
`sailplan.planner.api.make_plan` is the front door that completes them first. See
engine.py for the algorithm.
"""

from sailplan.planner.search.engine import search as plan

__all__ = ["plan"]
