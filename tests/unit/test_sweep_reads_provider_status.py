"""The sweep's decision table sees the provider's last stored status (``jobs.provider_status``):
a status rule is one row function in ``reconcile.sweep.table._TABLE`` reading
``r.provider_status``. A status no row names changes no decision (every line of
``tests/unit/test_sweep_decide.py`` decides alike with it stored)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

import reconcile.sweep.table as table
from reconcile.settings import Settings
from reconcile.sweep.table import Action, Decision, decide
from tests.unit.test_sweep_decide import (
    ASYNC,
    BASE_SETTINGS,
    KINDS,
    NOW,
    TABLE,
    accepted,
    ago,
    job,
)

SETTINGS = Settings(**BASE_SETTINGS)
STALE = accepted(provider_call_started_at=ago(11))  # past the 10-minute threshold: polled


# a status no row of the library names (a rule on it is the test's own)
UNNAMED = "on_hold_by_the_test"


def _status_rule(r: Any) -> Decision | None:
    """A row as a change request would add it: on the stored status alone."""
    if r.provider_status == UNNAMED:
        return Decision("held", Action.LEAVE)
    return None


def test_a_row_function_decides_on_the_stored_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """One row function placed before ``accepted`` (the first row that matches wins) takes a
    held job out of the poll; any other status, or none, goes on to ``accepted``."""
    rows = list(table._TABLE)
    monkeypatch.setattr(table, "_TABLE", (*rows[:rows.index(table._accepted)], _status_rule,
                                          *rows[rows.index(table._accepted):]))
    assert decide(SETTINGS, job(**STALE, provider_status=UNNAMED), ASYNC, NOW) \
        == Decision("held", Action.LEAVE)
    for other in ("processing", UNNAMED.upper(), None):
        assert decide(SETTINGS, job(**STALE, provider_status=other), ASYNC, NOW) \
            == Decision("accepted", Action.POLL), other


def test_the_row_input_carries_the_jobs_status() -> None:
    row = table._Row(SETTINGS, job(**STALE, provider_status="generating"), ASYNC, NOW)
    assert row.provider_status == "generating"
    assert table._Row(SETTINGS, job(**STALE), ASYNC, NOW).provider_status is None


@pytest.mark.parametrize("status", [UNNAMED, "x" * 64, ""])
@pytest.mark.parametrize(("columns", "kind", "overrides", "cutoff", "expected"),
                         [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_a_status_no_row_names_changes_no_decision(
        columns: dict[str, Any], kind: str | None, overrides: dict[str, Any],
        cutoff: datetime | None, expected: Decision, status: str) -> None:
    """Every line of the decision table's test decides the same with a status no row names
    stored (a line that sets its own status keeps it): storing a status is inert until a row
    reads it."""
    settings = Settings(**{**BASE_SETTINGS, **overrides})
    row = job(**{"provider_status": status, **columns})
    assert decide(settings, row, KINDS[kind], NOW, legacy_cutoff=cutoff) == expected
