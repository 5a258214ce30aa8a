"""Cancel's decision (reconcile.lifecycle.cancel.decide), database-free and table-driven."""

from __future__ import annotations

import pytest

from reconcile.lifecycle.cancel import Verdict, decide

V = Verdict
# (status, submission_state, provider_call_started_at set, provider_task_id) -> verdict
TABLE = [
    ("completed", "accepted", True, "t1", V.NOT_CANCELABLE),
    ("failed", "not_started", False, None, V.NOT_CANCELABLE),
    ("cancelled", None, False, None, V.NOT_CANCELABLE),
    ("pending", "not_started", False, None, V.NOT_STARTED),
    ("pending", "not_started", True, "t1", V.NOT_STARTED),  # the CAS on not_started decides
    ("pending", None, False, None, V.PLATFORM_ROW),
    ("pending", None, False, "", V.PLATFORM_ROW),  # an empty id is no id
    ("processing", None, True, None, V.RECONCILIATION_REQUIRED),  # the provider was called
    ("processing", None, False, "t1", V.RECONCILIATION_REQUIRED),  # an id without the marker
    ("processing", "accepted", True, "t1", V.ACCEPTED),
    ("pending", "accepted", True, "t1", V.ACCEPTED),
    ("processing", "accepted", True, None, V.RECONCILIATION_REQUIRED),  # accepted, no id yet
    ("processing", "accepted", True, "", V.RECONCILIATION_REQUIRED),
    ("pending", "submitting", True, None, V.RECONCILIATION_REQUIRED),
    ("pending", "uncertain", True, None, V.RECONCILIATION_REQUIRED),
    ("pending", "uncertain", True, "t1", V.RECONCILIATION_REQUIRED),
    ("pending", "rejected", True, None, V.RECONCILIATION_REQUIRED),
]


@pytest.mark.parametrize(("status", "state", "started", "task_id", "expected"), TABLE)
def test_decide(status: str, state: str | None, started: bool, task_id: str | None,
                expected: Verdict) -> None:
    assert decide(status, state, call_started=started, task_id=task_id) is expected
