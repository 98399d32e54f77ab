"""`python -m sailplan.operator.profiling.report DIR`: print a profiling pod's results to its log.

Runs as the `report` container of a profiling pod, after the profiler (an init container)
has written its profile files into DIR. It prints them as ONE ProfileSet JSON document
between two marker lines, which the operator finds in the container's log
(profiling.results.parse_report). Needs only the planner's profile types (it runs in the
trainer image, which installs the whole sailplan package); no API access.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

from sailplan.planner.profiles.store import ProfileStoreError, dumps, load_profile_dir

BEGIN: Final = "----- sailplan profiles begin -----"
END: Final = "----- sailplan profiles end -----"


def render(directory: Path) -> str:
    profiles = load_profile_dir(directory)
    return f"{BEGIN}\n{dumps(profiles)}\n{END}\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m sailplan.operator.profiling.report DIR", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(render(Path(args[0])))
    except ProfileStoreError as error:
        print(f"report: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
