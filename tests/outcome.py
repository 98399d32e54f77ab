"""Whether a test failed, asked from a fixture's teardown, so the fixture can print what
explains the failure (tests/conftest.py's `pytest_runtest_makereport` keeps the reports on
the test item)."""

from __future__ import annotations

import pytest


def failed(request: pytest.FixtureRequest) -> bool:
    """Whether the test that requested the fixture failed in its setup or its call."""
    return any(
        getattr(getattr(request.node, f"report_{when}", None), "failed", False)
        for when in ("setup", "call")
    )
