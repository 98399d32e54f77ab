"""The shared wait loop (tests/waiting.py): it returns the first truthy value, looks at the
condition once more after sleeping past the deadline, and a timeout names what was awaited
with the explanation, even when the explanation itself fails."""

from __future__ import annotations

import itertools

import pytest
from waiting import poll, wait_for


def test_returns_the_first_truthy_value_not_just_true() -> None:
    values = iter([None, [], {"phase": "Running"}, {"phase": "later"}])
    assert wait_for("a phase", lambda: next(values), 5, interval_s=0) == {"phase": "Running"}


def test_a_condition_met_during_the_last_sleep_is_not_a_timeout() -> None:
    calls = itertools.count(1)
    # The first check fails, the sleep overshoots the 10 ms deadline, the second check passes.
    assert poll(lambda: next(calls) == 2, 0.01, interval_s=0.05) is True
    assert poll(lambda: False, 0.01, interval_s=0.05) is None


def test_timeout_names_what_and_appends_the_explanation() -> None:
    with pytest.raises(AssertionError) as error:
        wait_for("the job to finish", lambda: None, 0, lambda: "phase: Pending", interval_s=0)
    assert str(error.value) == "timed out after 0s waiting for the job to finish\nphase: Pending"


def test_a_failing_explanation_does_not_hide_the_timeout() -> None:
    def broken() -> str:
        raise ConnectionError("API server gone")

    with pytest.raises(AssertionError) as error:
        wait_for("pods", lambda: None, 0, broken, interval_s=0)
    assert str(error.value).startswith("timed out after 0s waiting for pods\n")
    assert "API server gone" in str(error.value)
