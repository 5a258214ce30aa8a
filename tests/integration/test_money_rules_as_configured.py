"""The money rules as a platform configures them: partial settlement
policies set as deployment configuration, a policy changed mid-life, an operator's writers
racing a user's cancel, re-charges and releases racing each other. Each ends with the ledger's
money identities checked by ``credits.audit``."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, credits, lifecycle
from reconcile.db.models import CreditBalance, CreditTransaction, Job
from reconcile.errors import LedgerError
from reconcile.lifecycle.cancel import cancel_job
from reconcile.settlement import SettlementPolicy, SettleOutcome, kept_of
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import Clock, fund, make_runtime
from tests.integration.test_settlement_causes import _balance, _job

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
RUNNING = ((0.0, "queued"), (3600.0, "succeeded"))
FAILED = ((0.0, "queued"), (0.0, "failed"))


def _rt(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, **policy: str) -> Runtime:
    rt, _ = make_runtime(db, simulator, tmp_path, clock=Clock(T0), **policy)
    return rt


def _audit(rt: Runtime) -> list[tuple[str, Any]]:
    with rt.sessions() as s:
        return [(d.kind, d.job_id) for d in credits.audit(s, now=T0, settings=rt.settings)]


def _submit(rt: Runtime, db: sessionmaker[Session], kind: str = "replicate-prediction",
            model: str = "acme/flux") -> tuple[uuid.UUID, uuid.UUID]:
    user = uuid.uuid4()
    fund(db, user)
    job_id = lifecycle.submit_job(rt, user, kind, model, {"prompt": "a cat"}, 40,
                                  job_type="image").job_id
    return user, job_id


def _failed_accepted(rt: Runtime, db: sessionmaker[Session],
                     simulator: Simulator) -> tuple[uuid.UUID, uuid.UUID]:
    """An accepted job the provider then reported failed, its failure saved but not settled
    (the worker died between the two)."""
    simulator.script_default(Script(timeline=FAILED))
    user, job_id = _submit(rt, db)
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    with db.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(
            status="failed", error_code="UPSTREAM_FAILED", completed_at=T0, next_poll_at=T0))
    return user, job_id


# ----------------------------------------------------------------------------- policy change


def test_a_policy_changed_between_the_failure_and_its_settlement(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """A failure saved under "failures keep half", settled after a redeploy under "failures
    keep two thirds": the settlement keeps what the policy in force when it runs keeps, and
    the audit — under the new policy and under the old one — accepts it (its record)."""
    old = _rt(db, simulator, tmp_path, failure_refund="1/2")
    user, job_id = _failed_accepted(old, db, simulator)
    new = _rt(db, simulator, tmp_path, failure_refund="1/3")
    assert lifecycle.settle(new, job_id) is SettleOutcome.SETTLED
    assert _job(db, job_id).credits_actual == kept_of(40, Fraction(1, 3)) == 26
    assert _balance(db, user) == 1000 - 26
    assert _audit(new) == [] and _audit(old) == []
    # and a full refund under the default policy is never called wrong by a later policy
    default = _rt(db, simulator, tmp_path)
    user2, job2 = _failed_accepted(default, db, simulator)
    assert lifecycle.settle(default, job2) is SettleOutcome.SETTLED
    assert _balance(db, user2) == 1000
    assert _audit(new) == [] and _audit(default) == []


def test_rt_settings_swapped_mid_process_takes_the_new_policy(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """``rt.settings = …`` mid-process: the runtime's policy follows the new settings (never
    the old one silently), and a policy assigned against them is refused."""
    rt = _rt(db, simulator, tmp_path, failure_refund="1/2")
    assert rt.settlement_policy == SettlementPolicy(failure_refund=Fraction(1, 2))
    rt.settings = rt.settings.model_copy(update={"failure_refund": Fraction(0)})
    assert rt.settlement_policy == SettlementPolicy(failure_refund=Fraction(0))
    with pytest.raises(ValueError):
        rt.settlement_policy = SettlementPolicy(failure_refund=Fraction(1, 2))
    user, job_id = _failed_accepted(rt, db, simulator)
    assert lifecycle.settle(rt, job_id) is SettleOutcome.SETTLED
    assert _job(db, job_id).credits_actual == 40 and _balance(db, user) == 960
    assert _audit(rt) == []


# ----------------------------------------------------------------------------- cancel races


def test_an_operator_fail_between_the_upstream_cancel_and_the_cancels_write(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under "a cancel keeps everything, a failure nothing" (cancel 0, failure 1): the user
    cancels an accepted job; between the provider's cancel and the cancel's own write an
    operator's ``reconcile fail`` fails the job. Whatever the cancel answers, the money must
    agree with it: a cancel the user is told happened is settled as a cancel, and a 409 ("the
    job is failed, not cancelable") is never charged a cancel's share."""
    from reconcile.errors import Conflict

    rt = _rt(db, simulator, tmp_path, failure_refund="1", cancel_refund="0")
    simulator.script_default(Script(timeline=RUNNING))
    user, job_id = _submit(rt, db)
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    client = rt.client(rt.kind("replicate-prediction"))
    real_cancel = client.cancel

    def cancel_then_operator_fails(task_id: str, **kwargs: Any) -> bool:
        done = real_cancel(task_id, **kwargs)
        assert lifecycle.fail_job(rt, job_id, "RECONCILE_NO_RECOVERY", "reconcile_no_recovery",
                                  {"by": "operator", "reason": "stuck"})
        return done

    monkeypatch.setattr(client, "cancel", cancel_then_operator_fails)
    try:
        answer: Any = cancel_job(rt, user, job_id).status
    except Conflict as exc:
        answer = exc.code
    job = _job(db, job_id)
    if answer == "cancelled":
        assert job.credits_actual == 40 and _balance(db, user) == 960
    else:  # the user was told the cancel did not happen: the operator's fail settles it
        assert (answer, job.status) == ("JOB_NOT_CANCELABLE", "failed")
        assert job.credits_actual == 0 and _balance(db, user) == 1000, answer
    assert _audit(rt) == []


# ----------------------------------------------------------------------------- re-charge


def _half_settled_then_completed(rt: Runtime, db: sessionmaker[Session],
                                 simulator: Simulator) -> tuple[uuid.UUID, uuid.UUID]:
    user, job_id = _failed_accepted(rt, db, simulator)
    assert lifecycle.settle(rt, job_id) is SettleOutcome.SETTLED
    with db.begin() as s:  # the platform's own worker completes it
        s.execute(update(Job).where(Job.id == job_id).values(status="completed"))
    return user, job_id


def test_a_recharge_never_takes_more_than_the_settlement_returned(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """A job settled with half back (20 of 40) and then completed: a re-charge takes back at
    most the 20 that went back — the job never costs more than its reservation, which the
    pricing hook cannot exceed either (``commit_exceeds_held``). Nothing is written when
    refused."""
    rt = _rt(db, simulator, tmp_path, failure_refund="1/2")
    user, job_id = _half_settled_then_completed(rt, db, simulator)
    assert _balance(db, user) == 980
    with db.begin() as s:
        with pytest.raises(LedgerError) as refused:
            credits.recharge(s, job_id, 500, now=T0)
    assert refused.value.reason == "recharge_exceeds_returned"
    assert _balance(db, user) == 980 and _job(db, job_id).credits_actual == 20
    with db.begin() as s:
        assert credits.recharge(s, job_id, 20, now=T0) is True
    assert _balance(db, user) == 960 and _job(db, job_id).credits_actual == 40
    assert _audit(rt) == []


def test_two_concurrent_recharges_charge_once(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Two operators re-charge the same partly settled, completed job at once (two real
    PostgreSQL transactions): one charge."""
    rt = _rt(db, simulator, tmp_path, failure_refund="1/2")
    user, job_id = _half_settled_then_completed(rt, db, simulator)
    barrier = threading.Barrier(2)
    results: list[Any] = []

    def recharge() -> None:
        barrier.wait()
        try:
            with db.begin() as s:
                results.append(credits.recharge(s, job_id, 20, now=T0))
        except Exception as exc:  # noqa: BLE001 - reported below
            results.append(exc)

    threads = [threading.Thread(target=recharge) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert sorted(map(repr, results)) == ["False", "True"]
    assert _balance(db, user) == 960 and _job(db, job_id).credits_actual == 40
    assert _audit(rt) == []


# ----------------------------------------------------------------------------- orphans


def test_release_orphan_racing_a_late_settle_of_the_same_job(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """A failed job's settlement (half kept) runs while the platform deletes its row and an
    operator releases the reservation as an orphan: exactly one of them settles it."""
    rt = _rt(db, simulator, tmp_path, failure_refund="1/2")
    user, job_id = _failed_accepted(rt, db, simulator)
    started, release = threading.Event(), threading.Event()
    out: dict[str, Any] = {}
    from reconcile.lifecycle import settling

    real_held = settling._held

    def held_then_wait(session: Session, jid: uuid.UUID) -> int:
        value = real_held(session, jid)
        started.set()
        release.wait(timeout=5)
        return value

    settling._held = held_then_wait  # type: ignore[assignment]
    try:
        settler = threading.Thread(target=lambda: out.setdefault("settle", lifecycle.settle(rt, job_id)))
        settler.start()
        assert started.wait(timeout=10)

        def delete_and_release() -> None:
            try:
                with db.begin() as s:
                    s.execute(Job.__table__.delete().where(Job.id == job_id))
                with db.begin() as s:
                    out["release"] = credits.release_orphan(s, job_id, "retention", now=T0)
            except Exception as exc:  # noqa: BLE001
                out["release"] = exc

        deleter = threading.Thread(target=delete_and_release)
        deleter.start()
        deleter.join(timeout=2)
        release.set()
        settler.join(timeout=20)
        deleter.join(timeout=20)
    finally:
        settling._held = real_held  # type: ignore[assignment]
    with db() as s:
        txns = sorted(s.execute(select(CreditTransaction.type).where(
            CreditTransaction.job_id == job_id)).scalars())
    assert out["settle"] is SettleOutcome.SETTLED, out
    assert out["release"] is False, out
    assert txns == ["COMMIT", "RELEASE", "USAGE"], txns
    assert _balance(db, user) == 980
    assert _audit(rt) == []


@pytest.mark.parametrize(("code", "detail", "expected"), [
    ("UPSTREAM_FAILED", None, "user_cancel"),  # a status read of our own upstream cancel
    ("RECONCILE_NO_RECOVERY", {"by": "operator"}, "operator_fail"),
    ("UPSTREAM_TIMEOUT", {"attempts": 18}, "exhaustion"),
    ("RECONCILE_NO_RECOVERY", {"via": "sweep"}, "exhaustion"),
])
def test_a_cancel_request_makes_only_a_status_reads_failure_the_users_cancel(
        code: str, detail: dict[str, Any] | None, expected: str) -> None:
    """The rule behind the race above, on a row: a recorded cancel request turns the failure a
    status read wrote (what the cancel relabels and answers 200 for) into the user's cancel;
    an operator's fail or an exhaustion written meanwhile stays what it is (the cancel answers
    409 for those, so they must not be charged a cancel's share)."""
    from types import SimpleNamespace

    from reconcile.kinds import get_kind
    from reconcile.settlement import settlement_cause

    row = SimpleNamespace(status="failed", error_code=code, error_detail=detail,
                          submission_state="accepted", provider_task_id="t",
                          provider_kind="replicate-prediction")
    assert settlement_cause(row, kind=get_kind(row.provider_kind), cancel_requested=True) == (
        expected, True)


# ----------------------------------------------------------------------------- interleaving


class _PauseAt:
    """Pauses the thread named ``A`` before its ``k``-th SQL statement until released (two real
    PostgreSQL transactions: whatever A holds stays held while the other writer runs)."""

    def __init__(self, k: int) -> None:
        self.k, self.count = k, 0
        self.paused, self.resume = threading.Event(), threading.Event()

    def __call__(self, *_args: Any) -> None:
        if threading.current_thread().name != "A":
            return
        self.count += 1
        if self.count == self.k:
            self.paused.set()
            self.resume.wait(timeout=15)


def _cancel_into(rt: Runtime, user: uuid.UUID, job_id: uuid.UUID, answer: dict[str, Any]) -> None:
    from reconcile.errors import Conflict

    try:
        answer["status"] = cancel_job(rt, user, job_id).status
    except Conflict as exc:
        answer["status"] = exc.code


def _other_writer(rt: Runtime, db: sessionmaker[Session], job_id: uuid.UUID, writer: str) -> None:
    if writer == "poll":  # reads the task: canceled once the user's upstream cancel went out
        lifecycle.observe(rt, _job(db, job_id), rt.kind("replicate-prediction"), via="poll")
    elif writer == "sweep":  # a process whose clock is a day later: past the job's horizon
        from reconcile.sweep import sweep

        sweep(rt)
    else:  # the operator's `reconcile fail`, as the command calls it
        from reconcile import jobstore

        lifecycle.fail_job(rt, job_id, "RECONCILE_NO_RECOVERY", "reconcile_no_recovery",
                           {"by": "operator", "reason": "stuck"},
                           where=(jobstore.outcome_known(),))


@pytest.mark.parametrize("writer", ["poll", "operator_fail", "sweep"])
@pytest.mark.parametrize(("failure", "cancel"), [("1/2", "1/3"), ("1", "0")])
def test_a_cancel_interleaved_with_another_writer_at_every_statement(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, writer: str,
        failure: str, cancel: str) -> None:
    """The user's cancel of an accepted job, paused before each of its SQL statements in turn
    while a poll (reading the provider's task) or an operator's fail runs to its end. Whatever
    interleaving: the answer and the money agree — a 200 ``cancelled`` keeps the cancel's
    share, a 409 keeps the share of what the row says happened — the job is settled exactly
    once, and the audit is clean."""
    from sqlalchemy import event

    from reconcile.jobstore.events import cancel_requested
    from reconcile.settlement import refund_share, settlement_cause

    rt = _rt(db, simulator, tmp_path, failure_refund=failure, cancel_refund=cancel)
    other = rt
    if writer == "sweep":
        from datetime import timedelta

        other = _rt(db, simulator, tmp_path, failure_refund=failure, cancel_refund=cancel)
        other.clock = Clock(T0 + timedelta(days=1))
    engine = db.kw["bind"]
    outcomes: set[tuple[Any, ...]] = set()
    simulator.script_default(Script(timeline=RUNNING))
    k, seen = 1, 0
    while True:
        user, job_id = _submit(rt, db)
        assert lifecycle.create_step(rt, job_id).action == "accepted"
        pause = _PauseAt(k)
        answer: dict[str, Any] = {}
        event.listen(engine, "before_cursor_execute", pause)
        try:
            a = threading.Thread(target=_cancel_into, args=(rt, user, job_id, answer), name="A")
            a.start()
            while not pause.paused.is_set() and a.is_alive():
                pause.paused.wait(timeout=0.05)
            b = threading.Thread(target=_other_writer, args=(other, db, job_id, writer), name="B")
            b.start()
            b.join(timeout=3)
            pause.resume.set()
            a.join(timeout=30)
            b.join(timeout=30)
        finally:
            event.remove(engine, "before_cursor_execute", pause)
        assert not a.is_alive() and not b.is_alive()
        lifecycle.settle(rt, job_id)  # a settlement the race left pending, as the sweep would
        job = _job(db, job_id)
        with db() as s:
            asked = cancel_requested(s, job_id)
        cause, accepted = settlement_cause(job, kind=rt.kind(job.provider_kind),
                                           cancel_requested=asked)
        share = refund_share(cause, accepted, rt.settlement_policy)
        where = (k, writer, answer, job.status, job.error_code, cause)
        if answer["status"] == "cancelled":
            assert job.status == "cancelled" and cause == "user_cancel", where
        else:
            assert job.status == "failed" and cause != "user_cancel", where
        assert job.credits_actual == kept_of(40, share), where
        assert _balance(db, user) == 1000 - kept_of(40, share), where
        assert _audit(rt) == [], where
        seen += 1
        outcomes.add((str(answer["status"]), job.status, job.error_code, str(cause)))
        if pause.count < k:  # the cancel ran to its end before the k-th statement: all done
            break
        k += 1
    assert seen > 5
    # both sides of the race were reached: the cancel won at some statement, the operator's
    # fail at another (a poll or the sweep reads the task: canceled only once the upstream
    # cancel went out, a failure the cancel then relabels, so the cancel always answers 200)
    expected = {"cancelled", "JOB_NOT_CANCELABLE"} if writer == "operator_fail" else {"cancelled"}
    assert {o[0] for o in outcomes} == expected, outcomes


# ----------------------------------------------------------------------------- credits import


def test_two_credits_imports_at_once_grant_and_hold_once(db: sessionmaker[Session]) -> None:
    """Two operators run ``reconcile credits import`` at the same time (two PostgreSQL
    transactions): every balance is granted once and every reservation held once, whichever
    commits first; the other adds nothing (or fails, writing nothing). The audit is clean."""
    from datetime import timedelta

    from sqlalchemy import text

    from reconcile.credits.importer import import_credits
    from reconcile.db.models import UsageLog

    old = T0 - timedelta(hours=2)
    users = [uuid.uuid4() for _ in range(3)]
    jobs = []
    with db.begin() as s:
        s.execute(text("DROP TABLE IF EXISTS user_credits"))
        s.execute(text("CREATE TABLE user_credits (user_id uuid PRIMARY KEY, sub bigint, "
                       "topup bigint)"))
        for i, user in enumerate(users):
            s.execute(text("INSERT INTO user_credits VALUES (:u, :s, :t)"),
                      {"u": user, "s": 100 + i, "t": 7})
            job = uuid.uuid4()
            jobs.append(job)
            s.add(Job(id=job, user_id=user, job_type="image", status="processing",
                      created_at=old))
            s.flush()
            s.add(UsageLog(id=uuid.uuid4(), job_id=job, user_id=user, status="reserved",
                           credits=30, metadata_={"from_sub": 20, "from_topup": 10},
                           created_at=old))
    barrier = threading.Barrier(2)
    results: list[Any] = []

    def run() -> None:
        barrier.wait()
        try:
            with db.begin() as s:
                summary = import_credits(s, now=T0)
            results.append((summary.users, summary.reservations))
        except Exception as exc:  # noqa: BLE001 - reported below
            results.append(type(exc).__name__)

    try:
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        with db() as s:
            for i, user in enumerate(users):
                bal = s.get(CreditBalance, user)
                assert bal is not None and (bal.sub, bal.topup) == (100 + i, 7), (results, i)
            usages = s.execute(select(CreditTransaction.id).where(
                CreditTransaction.type == "USAGE")).scalars().all()
            assert sorted(usages) == sorted(f"job-usage:{j}" for j in jobs), results
            assert credits.audit(s, now=T0) == [], results
        # a third run adds nothing
        with db.begin() as s:
            again = import_credits(s, now=T0)
        assert (again.users, again.reservations) == (0, 0)
    finally:
        with db.begin() as s:
            s.execute(text("DROP TABLE IF EXISTS user_credits"))


# ----------------------------------------------------------------------------- late completion


def _platform_completes_clearing_its_error(db: sessionmaker[Session], simulator: Simulator,
                                           tmp_path: Path) -> tuple[Any, uuid.UUID]:
    """Finding 4's setup (the legacy sweep fails a platform row and settles it partly under
    failures-keep-half), but the platform's own worker completes the row as many do: status
    completed and its error fields cleared (``error_code = NULL``)."""
    from sqlalchemy import update as sql_update

    from tests.integration._sweep_helpers import World
    from tests.integration.test_settle_owed import half_settled_then_completed

    w = World(db, simulator, tmp_path)
    row = half_settled_then_completed(w)
    with db.begin() as s:
        s.execute(sql_update(Job).where(Job.id == row).values(error_code=None,
                                                               error_message=None))
    return w, row


def test_a_partial_settlement_completed_by_a_platform_that_clears_its_error_is_flagged(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """The audit reports ``completed_after_refund`` (20 went back) although the platform's
    completion cleared ``error_code``: the settlement's own record in the usage log says the
    library settled the job as failed, which a priced completion's commit for less never
    writes."""
    from tests.integration.test_settle_owed import audit_of

    w, row = _platform_completes_clearing_its_error(db, simulator, tmp_path)
    found = [(d.kind, d.job_id) for d in audit_of(w)]
    assert found == [("completed_after_refund", row)]
    with w.db.begin() as s:
        assert credits.recharge(s, row, 20, now=w.clock.now) is True
    assert audit_of(w) == []


@pytest.mark.xfail(strict=True, reason="the sweep's late-completion candidates come from the "
                   "partial index COMPLETED_AFTER_FAILURE (status completed AND error_code IS "
                   "NOT NULL); a platform completion that clears error_code is not a candidate. "
                   "Widening it needs a migration (not added: the lead chains them)")
def test_the_sweep_records_it_too(db: sessionmaker[Session], simulator: Simulator,
                                  tmp_path: Path) -> None:
    w, row = _platform_completes_clearing_its_error(db, simulator, tmp_path)
    assert w.tick().late_completions == 1
