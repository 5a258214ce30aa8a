"""The operator actions (``reconcile.operator``): one home for what a person may do by hand, so
the CLI, the console and the Django admin refuse and allow alike; ``reconcile retry-settle``
inherits the settle guard (a platform's own failed row is refused and untouched); every action
done is in the operator record with who, through which surface and why, and the customer's
snapshot never shows the reason."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import api, operator
from reconcile.db.models import OperatorAction
from reconcile.testing.simulator import Simulator
from tests.integration._sweep_helpers import World
from tests.integration.test_cli import cli_with
from tests.integration.test_settle_owed import assert_untouched, library_failed, platform_failed_row

ADMIN = operator.Operator("ops@example.test", via="console")


def _records(w: World, job_id: uuid.UUID) -> list[OperatorAction]:
    with w.db() as s:
        return list(s.query(OperatorAction).filter_by(job_id=job_id).order_by(OperatorAction.id))


def test_retry_settle_settles_a_pending_settlement_and_records_who(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(db, simulator, tmp_path)
    job_id = library_failed(w)
    assert w.job(job_id).credits_actual is None
    monkeypatch.setenv("RECONCILE_OPERATOR", "alice")
    said = cli_with(w.rt, "retry-settle", str(job_id), "--reason", "ledger back after the outage")
    assert said.exit_code == 0, said.output
    assert "settled" in said.stdout and "refunded 40" in said.stdout
    assert w.job(job_id).credits_actual == 0 and w.refunds(job_id) == 1
    (row,) = _records(w, job_id)
    assert (row.operator, row.via, row.action, row.reason) == (
        "alice", "cli", "retry_settle", "ledger back after the outage")
    # again: settled already, refused (exit 2), nothing recorded, nothing refunded twice
    again = cli_with(w.rt, "retry-settle", str(job_id), "--reason", "twice")
    assert again.exit_code == 2 and "settled already" in again.stderr
    assert w.refunds(job_id) == 1 and len(_records(w, job_id)) == 1
    # the record, exported
    log = cli_with(w.rt, "operator-log", "--job", str(job_id), "--json")
    assert log.exit_code == 0, log.output
    assert [r["action"] for r in json.loads(log.stdout)] == ["retry_settle"]


def test_retry_settle_refuses_a_platform_own_failed_row(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """The obvious implementation (``lifecycle.settle`` on any failed row with no
    ``credits_actual``) would refund a platform's legacy failed row; the guard is inherited."""
    w = World(db, simulator, tmp_path)
    row = platform_failed_row(w)
    said = cli_with(w.rt, "retry-settle", str(row), "--reason", "looks stuck")
    assert said.exit_code == 2 and "the platform's to settle" in said.stderr
    assert_untouched(w, row)
    assert _records(w, row) == []
    with pytest.raises(operator.ActionRefused):
        operator.run(w.rt, operator.RETRY_SETTLE, row, operator=ADMIN, reason="x")
    assert operator.allowed(w.rt, row) == []
    assert_untouched(w, row)


def test_an_action_needs_a_reason_and_the_customer_never_sees_it(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    w = World(db, simulator, tmp_path)
    job_id = w.submit("kie-standard")
    for blank in (None, "", "   "):
        with pytest.raises(operator.ActionRefused, match="reason"):
            operator.run(w.rt, operator.FAIL, job_id, operator=ADMIN, reason=blank)
    assert _records(w, job_id) == []
    assert operator.FAIL in operator.allowed(w.rt, job_id)
    secret = "customer 42 disputed; see ticket OPS-991"
    done = operator.run(w.rt, operator.FAIL, job_id, operator=ADMIN, reason=secret)
    assert done.changed and w.job(job_id).status == "failed"
    (row,) = _records(w, job_id)
    assert (row.operator, row.via, row.reason) == ("ops@example.test", "console", secret)
    user = w.job(job_id).user_id
    status, snap = api.snapshot(w.rt, user, job_id)
    assert status == 200 and snap["state"] == "failed", snap
    body = json.dumps(snap, default=str)
    events = json.dumps(api.events_after(w.rt, user, job_id)[0], default=str)
    assert "OPS-991" not in body and "OPS-991" not in events
    # failing again answers "nothing done", records nothing
    again = operator.run(w.rt, operator.FAIL, job_id, operator=ADMIN, reason="again")
    assert not again.changed and len(_records(w, job_id)) == 1


def test_refusals_name_the_reason_and_write_nothing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    w = World(db, simulator, tmp_path)
    job_id = w.submit("kie-standard")
    missing = uuid.uuid4()
    for action in (operator.FAIL, operator.RETRY_SETTLE, operator.RESOLVE_NOT_SUBMITTED):
        assert operator.refusal(w.rt, action, missing) == f"no job {missing}"
    assert "only uncertain submissions" in (operator.refusal(
        w.rt, operator.RESOLVE_NOT_SUBMITTED, job_id) or "")
    assert "exists" in (operator.refusal(w.rt, operator.RELEASE_ORPHAN, job_id) or "")
    with pytest.raises(operator.ActionRefused, match="upstream id"):
        operator.run(w.rt, operator.RESOLVE_UPSTREAM, job_id, operator=ADMIN, reason="x")
    with pytest.raises(ValueError):
        operator.Operator("", via="console")
    with pytest.raises(ValueError):
        operator.Operator("bob", via="email")
    assert _records(w, job_id) == []
