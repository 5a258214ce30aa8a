"""The sweep's decision table sees the provider's last stored status (``jobs.provider_status``):
a status rule is one row function in ``reconcile.sweep.table._TABLE`` reading
``r.provider_status``. No row of the library reads it yet, so storing a status changes no
decision (every line of ``tests/unit/test_sweep_decide.py`` decides alike with any status)."""

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


def _status_rule(r: Any) -> Decision | None:
    """A row as a change request would add it: on the stored status alone."""
    if r.provider_status == "paused":
        return Decision("paused", Action.LEAVE)
    return None


def test_a_row_function_decides_on_the_stored_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """One row function placed before ``accepted`` (the first row that matches wins) takes a
    paused job out of the poll; any other status, or none, goes on to ``accepted``."""
    rows = list(table._TABLE)
    monkeypatch.setattr(table, "_TABLE", (*rows[:rows.index(table._accepted)], _status_rule,
                                          *rows[rows.index(table._accepted):]))
    assert decide(SETTINGS, job(**STALE, provider_status="paused"), ASYNC, NOW) \
        == Decision("paused", Action.LEAVE)
    for other in ("processing", "PAUSED", None):
        assert decide(SETTINGS, job(**STALE, provider_status=other), ASYNC, NOW) \
            == Decision("accepted", Action.POLL), other


def test_the_row_input_carries_the_jobs_status() -> None:
    row = table._Row(SETTINGS, job(**STALE, provider_status="generating"), ASYNC, NOW)
    assert row.provider_status == "generating"
    assert table._Row(SETTINGS, job(**STALE), ASYNC, NOW).provider_status is None


@pytest.mark.parametrize("status", ["paused", "processing", "x" * 64, ""])
@pytest.mark.parametrize(("columns", "kind", "overrides", "cutoff", "expected"),
                         [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_no_row_reads_the_status_today(columns: dict[str, Any], kind: str | None,
                                       overrides: dict[str, Any], cutoff: datetime | None,
                                       expected: Decision, status: str) -> None:
    """Every line of the decision table's test decides the same with a stored status: the
    column is only made available (a status rule is a change of its own)."""
    settings = Settings(**{**BASE_SETTINGS, **overrides})
    row = job(**{**columns, "provider_status": status})
    assert decide(settings, row, KINDS[kind], NOW, legacy_cutoff=cutoff) == expected
