"""Issue 24: which settlements the library owes, and what went back to the user.

``lifecycle.settle`` enforces its own precondition (``jobstore.must_settle``), so the Celery
``reconcile.settle`` task and every other caller refuse a platform's own failed row; an
observe-only kind never stops a settlement the library already owes (finding 11); ``reconcile
fail`` refuses a platform row whose provider call is in flight, as a cancel does (finding 12); a
completion after a partial settlement is flagged and can be re-charged (finding 4); the CLI and
the snapshot say what went back (``Ledger.refunded``).
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits, jobstore, lifecycle, tasks
from reconcile.db.models import Job
from reconcile.ledger import audit as library_audit
from reconcile.settlement import SettlementPolicy, SettleOutcome
from reconcile.testing.simulator import Simulator
from tests.integration import harness
from tests.integration._sweep_helpers import World
from tests.integration.ledgers import make_backend

FUNDS = 100_000


def platform_failed_row(w: World) -> uuid.UUID:
    """A platform's own row from before adoption that the platform itself marked failed: no
    kind, no submission state, never failed by the library (``next_poll_at`` NULL), still
    holding its reservation of 40."""
    at = w.clock.now - timedelta(hours=4)
    return w.platform_row(status="failed", created_at=at, started_at=at, completed_at=at,
                          error_code="PLATFORM_ERROR")


def library_failed(w: World) -> uuid.UUID:
    """A library job whose failure was saved and whose refund never ran (a worker died
    between the two: ``next_poll_at`` set, ``credits_actual`` NULL)."""
    job_id = w.submit("kie-standard")
    with w.db.begin() as s:
        assert jobstore.mark_failed(s, job_id, now=w.clock.now, code="UPSTREAM_FAILED",
                                    message="failed", detail=None) is not None
    return job_id


def assert_untouched(w: World, row: uuid.UUID) -> None:
    job = w.job(row)
    assert (job.status, job.credits_actual, job.next_poll_at) == ("failed", None, None)
    assert w.log_status(row) == "reserved" and w.refunds(row) == 0
    assert w.pools(w.user) == (FUNDS - 40, 0)


def test_settle_refuses_a_platform_own_failed_row(db: sessionmaker[Session],
                                                  simulator: Simulator, tmp_path: Path) -> None:
    """``lifecycle.settle`` on a failed row the library never failed is NOT_DUE and moves no
    credit (README, Design notes: Refunds need evidence); old code refunded it. Neither the
    sweep nor ``reconcile fail`` touches it, and the CLI says whose it is."""
    from tests.integration.test_cli import cli_with

    w = World(db, simulator, tmp_path)
    row = platform_failed_row(w)
    assert lifecycle.settle(w.rt, row) is SettleOutcome.NOT_DUE
    assert lifecycle.settle(w.rt, row) is SettleOutcome.NOT_DUE
    assert_untouched(w, row)
    # `reconcile fail` does not promise the sweep will refund it (it will not)
    said = cli_with(w.rt, "fail", str(row))
    assert said.exit_code == 0 and "pending" not in said.stderr
    assert "the platform's to settle" in said.stderr
    w.clock.advance(hours=1)
    w.tick()
    assert_untouched(w, row)


def test_the_celery_settle_task_refuses_it_too(db: sessionmaker[Session], simulator: Simulator,
                                               tmp_path: Path) -> None:
    """The ``reconcile.settle`` task function gets the guard from ``lifecycle.settle``; a
    library failure whose refund is owed still settles through it."""
    w = World(db, simulator, tmp_path)
    row = platform_failed_row(w)
    owed = library_failed(w)
    tasks.set_runtime(w.rt)
    try:
        assert tasks.settle(str(row)) == SettleOutcome.NOT_DUE
        assert tasks.settle(str(owed)) == SettleOutcome.SETTLED
    finally:
        tasks.reset_runtime()
    job = w.job(owed)
    assert job.credits_actual == 0 and w.log_status(owed) == "refunded"
    assert_untouched(w, row)


def test_observe_only_never_stops_a_settlement_the_library_owes(db: sessionmaker[Session],
                                                                 simulator: Simulator,
                                                                 tmp_path: Path) -> None:
    """Finding 11: a worker died between saving a failure and its refund, and the kind is
    observe-only (by name and by ``*``). The sweep settles it: observe-only governs decisions
    about the upstream, not a refund already owed. Old code left it held (the audit said
    ``terminal_job_reserved``)."""
    for names in (["kie-standard"], ["*"]):
        w = World(db, simulator, tmp_path, observe_only_kinds=names)
        owed = library_failed(w)
        stuck = w.accept("kie-standard")  # an upstream decision: still only observed
        w.clock.advance(hours=3)
        report = w.tick()
        job = w.job(owed)
        assert (job.status, job.credits_actual, job.next_poll_at) == ("failed", 0, None)
        assert w.log_status(owed) == "refunded" and w.refunds(owed) == 1
        assert w.job(stuck).status == "processing" and w.log_status(stuck) == "reserved"
        assert report.observed >= 1
        with w.db() as s:  # the audit with the same settings: nothing held past its end
            found = library_audit(w.rt.ledger, s, now=w.clock.now, settings=w.rt.settings)
        assert [d for d in found if d.job_id == owed] == []
        assert [d.kind for d in found if d.kind == "terminal_job_reserved"] == []


def test_reconcile_fail_refuses_a_platform_row_whose_call_is_in_flight(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Finding 12: a platform row whose provider call ``sync_call`` started (no result yet) is
    refused by ``reconcile fail`` as a user's cancel refuses it (409), by the same predicate;
    the fail's own CAS guard refuses it too (a call marked between the read and the CAS). A
    platform row with no call started is still failed + refunded. Old code refunded it."""
    from reconcile import api
    from tests.integration.test_cli import add_job, balance, cli, refunds

    in_call = add_job(db, submission=None, kind="anthropic-sync", task_id=None,
                      age=timedelta(seconds=5))
    assert load_row(db, in_call).provider_call_started_at is not None
    result = cli(db, "fail", str(in_call))
    assert result.exit_code == 2, result.output
    assert "provider call started" in result.stderr
    assert load_row(db, in_call).status == "processing"
    assert balance(db, in_call) == 960 and refunds(db, in_call) == []

    w = World(db, simulator, tmp_path)
    status, body = api.cancel(w.rt, load_row(db, in_call).user_id, in_call)
    assert (status, body["error"]["code"]) == (409, "SUBMISSION_RECONCILIATION_REQUIRED")
    assert lifecycle.fail_job(w.rt, in_call, "RECONCILE_NO_RECOVERY", "x", None,
                              where=(jobstore.outcome_known(),)) is False

    idle = add_job(db, submission=None, kind=None, task_id=None)  # no call ever started
    done = cli(db, "fail", str(idle))
    assert done.exit_code == 0, done.output
    assert balance(db, idle) == 1000 and refunds(db, idle) == [40]


def load_row(db: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


HALF = SettlementPolicy(failure_refund=Fraction(1, 2))


def half_settled_then_completed(w: World) -> uuid.UUID:
    """Finding 4's setup: under failures-keep-half the legacy sweep (enforce) fails a platform
    row the platform had submitted (its own task id) and settles it partly (keeps 20, returns 20); the platform's own worker then completes
    it, as it writes its rows (status only)."""
    w.rt.settings = w.rt.settings.model_copy(update={"failure_refund": HALF.failure_refund})
    # the platform's own task id: accepted upstream by the platform's own marker, so the
    # failure share applies (a row without one is never accepted: refunded in full)
    row = w.platform_row(provider_task_id="platform-task-1")
    w.clock.advance(minutes=10)
    w.tick()
    job = w.job(row)
    assert (job.status, job.credits_actual, w.log_status(row)) == ("failed", 20, "committed")
    w.set(row, status="completed")
    return row


def audit_of(w: World) -> list[Any]:
    with w.db() as s:
        return library_audit(w.rt.ledger, s, now=w.clock.now, policy=w.rt.settlement_policy)


def test_a_completion_after_a_partial_settlement_is_flagged_and_can_be_recharged(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Finding 4: the sweep records one ``completed_after_refund`` anomaly, the audit reports
    it with what went back (20), and ``credits.recharge`` takes the returned part back — the
    job then costs 40 and the audit is clean. Old code: no anomaly, a clean audit, and the
    re-charge refused."""
    w = World(db, simulator, tmp_path)
    row = half_settled_then_completed(w)
    assert w.pools(w.user) == (FUNDS - 20, 0)

    report = w.tick()
    assert report.late_completions == 1
    assert w.anomalies(row, "completed_after_refund") == ["completed_after_refund"]
    w.tick()
    assert w.anomalies(row, "completed_after_refund") == ["completed_after_refund"]  # once
    found = [(d.kind, d.job_id) for d in audit_of(w)]
    assert found == [("completed_after_refund", row)]
    assert "returned 20 credits" in audit_of(w)[0].detail
    with w.db() as s:
        assert w.rt.ledger.refunded(s, row) == 20

    with w.db.begin() as s:
        assert credits.recharge(s, row, 20, now=w.clock.now) is True
    with w.db.begin() as s:
        assert credits.recharge(s, row, 20, now=w.clock.now) is False  # idempotent
        assert w.rt.ledger.refunded(s, row) == 0
    assert w.job(row).credits_actual == 40 and w.pools(w.user) == (FUNDS - 40, 0)
    assert audit_of(w) == []


def test_a_platform_ledger_flags_it_too(db: sessionmaker[Session], simulator: Simulator,
                                        tmp_path: Path) -> None:
    """The same completion under a platform's own ledger backend: the sweep's anomaly and the
    library's job checks read ``Ledger.refunded``, which counts a partial settlement's return."""
    with harness.ledger_backend(make_backend("platform", db)):
        w = World(db, simulator, tmp_path)
        row = half_settled_then_completed(w)
        assert w.tick().late_completions == 1
        assert w.anomalies(row) == ["completed_after_refund"]
        with w.db() as s:
            assert w.rt.ledger.refunded(s, row) == 20
        assert [(d.kind, d.job_id) for d in audit_of(w)] == [("completed_after_refund", row)]


def test_operators_and_the_user_see_what_went_back(db: sessionmaker[Session],
                                                   simulator: Simulator, tmp_path: Path) -> None:
    """Under failures-keep-half, ``reconcile fail`` of a 40-credit job says 20 went back (old
    code: "refunded 0 credits"), ``reconcile show`` and the customer snapshot give
    ``credits_returned`` 20 beside ``credits_actual`` 20; a full refund still reads 40."""
    from reconcile import api
    from tests.integration.test_cli import cli_with

    w = World(db, simulator, tmp_path)
    w.rt.settings = w.rt.settings.model_copy(update={"failure_refund": HALF.failure_refund})
    half = w.accept("kie-standard")
    result = cli_with(w.rt, "fail", str(half))
    assert result.exit_code == 0, result.output
    assert "refunded 20 credits, kept 20" in result.stdout
    shown = json.loads(cli_with(w.rt, "show", str(half), "--json").stdout)["job"]
    assert (shown["credits_actual"], shown["credits_returned"]) == (20, 20)
    assert "credits_returned" in cli_with(w.rt, "show", str(half)).stdout
    status, body = api.snapshot(w.rt, w.user, half)
    assert (status, body["credits_actual"], body["credits_returned"]) == (200, 20, 20)

    w.rt.settings = w.rt.settings.model_copy(update={"failure_refund": Fraction(1)})
    full = w.accept("kie-standard")
    assert "refunded 40 credits\n" in cli_with(w.rt, "fail", str(full)).stdout
    assert api.snapshot(w.rt, w.user, full)[1]["credits_returned"] == 40
