"""Attack on the settlement record (d8c7dd0): two settlers with different policies on one job
(a rolling deploy: worker 1 refunds a cancel in full, worker 2 keeps half), and a completion
racing a cancel, each started after every statement of the other (A paused after its k-th
statement; B runs until it completes or waits on a lock, seen in ``pg_stat_activity``; then A
goes on). Whatever the order: exactly one settlement, the record (if any) is the commit's,
the audit is clean under either policy and the ledger balanced."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, credits, lifecycle
from reconcile.db.models import CreditTransaction, Job, UsageLog
from reconcile.errors import Conflict
from reconcile.ledger import DEFAULT as LEDGER, audit as library_audit
from reconcile.lifecycle.cancel import cancel_job
from reconcile.settlement import DEFAULT_POLICY, SettlementPolicy
from reconcile.testing.simulator import Simulator
from tests.integration.harness import Clock, fund, make_runtime, use_policy

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
FULL = DEFAULT_POLICY
HALF = SettlementPolicy(cancel_refund=Fraction(1, 2), failure_refund=Fraction(1, 2))


class Pauser:
    """After the ``at``-th statement run by the thread named ``A``, waits for ``go``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.at = 0
        self.count = 0
        self.paused = threading.Event()
        self.go = threading.Event()
        event.listen(engine, "after_cursor_execute", self._after)

    def close(self) -> None:
        event.remove(self.engine, "after_cursor_execute", self._after)

    def _after(self, *args: Any) -> None:
        if threading.current_thread().name != "A":
            return
        self.count += 1
        if self.at and self.count == self.at:
            self.paused.set()
            assert self.go.wait(60)


def _b_waits_or_done(engine: Engine, pids: set[int], done: threading.Event) -> bool:
    if engine.dialect.name == "sqlite":  # BEGIN IMMEDIATE: B waits for A's transaction
        return not done.wait(0.3)
    with engine.connect() as probe:
        while not done.is_set():
            if pids:
                waiting = probe.execute(text(
                    "SELECT bool_or(wait_event_type = 'Lock') FROM pg_stat_activity "
                    "WHERE pid = ANY(:p)"), {"p": list(pids)}).scalar()
                if waiting:
                    return True
            probe.rollback()
            done.wait(0.005)
    return False


def _interleave(engine: Engine, setup: Callable[[], Any], op_a: Callable[[Any], Any],
                op_b: Callable[[Any], Any], check: Callable[[Any, dict[str, Any]], None]) -> int:
    """Runs B after each statement of A (and A alone first, to count them); ``check`` judges
    every outcome. Returns how many interleavings B waited on a lock in."""
    pauser = Pauser(engine)
    pids: set[int] = set()

    @event.listens_for(engine, "checkout")
    def _pid(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        if threading.current_thread().name == "B" and engine.dialect.name == "postgresql":
            pids.add(dbapi_conn.info.backend_pid)

    try:
        state = setup()
        out: dict[str, Any] = {}

        def run(name: str, op: Callable[[Any], Any]) -> Callable[[], None]:
            def go() -> None:
                try:
                    out[name] = ("ok", op(state))
                except Exception as exc:  # noqa: BLE001 - the outcome is judged
                    out[name] = ("raise", type(exc).__name__, str(exc)[:200])
            return go

        ta = threading.Thread(target=run("a", op_a), name="A")
        ta.start()
        ta.join(60)
        check(state, out)
        total = pauser.count
        assert total > 0
        waited = 0
        for k in range(1, total + 1):
            state = setup()
            out = {}
            pids.clear()
            pauser.at, pauser.count = k, 0
            pauser.paused.clear()
            pauser.go.clear()
            ta = threading.Thread(target=run("a", op_a), name="A")
            ta.start()
            if not pauser.paused.wait(30):
                ta.join()
                continue
            done = threading.Event()
            runner = run("b", op_b)

            def b(runner: Callable[[], None] = runner, done: threading.Event = done) -> None:
                try:
                    runner()
                finally:
                    done.set()

            tb = threading.Thread(target=b, name="B")
            tb.start()
            waited += _b_waits_or_done(engine, pids, done)
            pauser.go.set()
            ta.join(60)
            tb.join(60)
            assert not ta.is_alive() and not tb.is_alive()
            check(state, {**out, "k": k})
        return waited
    finally:
        pauser.close()
        event.remove(engine, "checkout", _pid)


def _ledger_state(db: sessionmaker[Session], job_id: uuid.UUID) -> tuple[Any, Any, Any, Any]:
    with db() as s:
        log = s.execute(select(UsageLog.status, UsageLog.metadata_)
                        .where(UsageLog.job_id == job_id)).one()
        txns = sorted(s.execute(select(CreditTransaction.type, CreditTransaction.amount)
                                .where(CreditTransaction.job_id == job_id)).all())
        job = s.get(Job, job_id)
        assert job is not None
        return log, txns, job.status, job.credits_actual


def _audits_clean(db: sessionmaker[Session]) -> None:
    for policy in (FULL, HALF):
        with db() as s:
            found = library_audit(LEDGER, s, now=T0, policy=policy)
            assert found == [], (policy, found)
    with db() as s:
        assert credits.audit(s, now=T0) == []


def _runtimes(db: sessionmaker[Session], simulator: Simulator,
              tmp_path: Path) -> tuple[Runtime, Runtime]:
    full, _ = make_runtime(db, simulator, tmp_path / "a", clock=Clock(T0))
    half, _ = make_runtime(db, simulator, tmp_path / "b", clock=Clock(T0))
    use_policy(full, FULL)
    use_policy(half, HALF)
    return full, half


@pytest.fixture
def runtimes(db: sessionmaker[Session], simulator: Simulator,
             tmp_path: Path) -> tuple[Runtime, Runtime]:
    return _runtimes(db, simulator, tmp_path)


@pytest.fixture
def factory(pg_and_sqlite: sessionmaker[Session]) -> sessionmaker[Session]:
    return pg_and_sqlite  # PostgreSQL, then SQLite (tests/integration/conftest.py)


def _truncate(db: sessionmaker[Session]) -> None:
    from tests.integration.test_ledger_differential import wipe

    wipe(db)


def _submit(rt: Runtime, user: uuid.UUID, amount: int) -> uuid.UUID:
    """A job the provider accepted (its task id saved): the policy's shares apply to it."""
    job_id = lifecycle.submit_job(rt, user, "kie-standard", "seedream/4.5-edit",
                                  {"prompt": "a cat"}, amount, job_type="image").job_id
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    return job_id


@pytest.mark.parametrize("first", ["full", "half"])
def test_two_settlers_with_different_policies_settle_once(
        factory: sessionmaker[Session], simulator: Simulator, tmp_path: Path, first: str) -> None:
    """A rolling deploy: worker 1 refunds a cancel in full, worker 2 keeps half; both settle
    the same cancelled job, B started after each statement of A. One of them settles, the
    other finds it settled; a half kept carries its record, a full refund none."""
    db = factory
    full, half = _runtimes(db, simulator, tmp_path)
    a, b = (full, half) if first == "full" else (half, full)
    engine = db.kw["bind"]

    def setup() -> uuid.UUID:
        _truncate(db)
        user, job_id = uuid.uuid4(), uuid.uuid4()
        with db.begin() as s:
            s.add(Job(id=job_id, user_id=user, job_type="image", status="pending",
                      created_at=T0, provider_kind="kie-standard", submission_state="accepted",
                      provider_task_id=f"t-{job_id}"))  # accepted: the policy's share applies
            credits.grant(s, user, "sub", 30, f"g-sub-{user}", now=T0)
            credits.grant(s, user, "topup", 100, f"g-topup-{user}", now=T0)
            credits.reserve(s, user, job_id, 41, now=T0)
        with db.begin() as s:
            s.execute(update(Job).where(Job.id == job_id)
                      .values(status="cancelled", completed_at=T0, error_code="CANCELED",
                              next_poll_at=T0))  # the library's cancel: its settlement is owed
        return job_id

    def check(job_id: uuid.UUID, out: dict[str, Any]) -> None:
        log, txns, status, actual = _ledger_state(db, job_id)
        assert status == "cancelled"
        settled = [v for v in (out.get("a"), out.get("b")) if v == ("ok", "settled")]
        assert len(settled) == 1, out
        if log.status == "refunded":
            assert actual == 0 and txns == [("REFUND", 41), ("USAGE", 41)], (out, txns)
            assert "settlement" not in (log.metadata_ or {})
        else:
            assert log.status == "committed", out
            assert actual == 20
            assert log.metadata_["settlement"] == {"status": "cancelled", "refund_share": "1/2",
                                                   "kept": 20}, out
            assert txns == [("COMMIT", 20), ("RELEASE", 21), ("USAGE", 41)], (out, txns)
        _audits_clean(db)

    waited = _interleave(engine, setup, lambda j: str(lifecycle.settle(a, j)),
                         lambda j: str(lifecycle.settle(b, j)), check)
    assert waited  # B really waited on A's locks somewhere


@pytest.mark.parametrize("first", ["cancel", "complete"])
def test_a_completion_racing_a_cancel_settles_once(
        db: sessionmaker[Session], runtimes: tuple[Runtime, Runtime], first: str) -> None:
    """A user's cancel (half kept, recorded) and a completion of the same job: either the job
    completed and its reservation committed in full with no record, or it is cancelled, half
    kept with its record; never both, and the audit is clean under either policy."""
    full, half = runtimes
    engine = db.kw["bind"]

    def setup() -> tuple[uuid.UUID, uuid.UUID]:
        _truncate(db)
        user = uuid.uuid4()
        fund(db, user, 100, "sub")
        return user, _submit(half, user, 40)

    def cancel(state: tuple[uuid.UUID, uuid.UUID]) -> str:
        try:
            return str(cancel_job(half, state[0], state[1]).status)
        except Conflict as exc:
            return f"conflict {exc.code}"

    def complete(state: tuple[uuid.UUID, uuid.UUID]) -> bool:
        return lifecycle.finalize_job_with_media(half, state[1], None, source="poll", outputs=())

    ops = (cancel, complete) if first == "cancel" else (complete, cancel)

    seen: set[str] = set()

    def check(state: tuple[uuid.UUID, uuid.UUID], out: dict[str, Any]) -> None:
        log, txns, status, actual = _ledger_state(db, state[1])
        seen.add(status)
        assert all(v[0] == "ok" for k, v in out.items() if k != "k"), out
        if status == "completed":
            assert log.status == "committed" and actual == 40, (out, txns)
            assert "settlement" not in (log.metadata_ or {}), out
        else:
            assert status == "cancelled", out
            assert log.status == "committed" and actual == 20, (out, txns)
            assert log.metadata_["settlement"] == {"status": "cancelled", "refund_share": "1/2",
                                                   "kept": 20}, out
        _audits_clean(db)

    waited = _interleave(engine, setup, ops[0], ops[1], check)
    assert waited
    assert seen == {"completed", "cancelled"}  # both orders really happened


@pytest.mark.parametrize("first", ["commit", "refund"])
def test_a_recorded_commit_racing_a_refund_at_the_ledger(
        factory: sessionmaker[Session], first: str) -> None:
    """The same race one level down, with no job row lock to serialize the two: the ledger's
    recorded commit (half kept) and its refund of the same reservation, each in its own
    transaction. The log's CAS lets one through; the record exists exactly when the commit
    does."""
    db = factory
    engine = db.kw["bind"]
    record = {"status": "cancelled", "refund_share": "1/2"}

    def setup() -> uuid.UUID:
        _truncate(db)
        user, job_id = uuid.uuid4(), uuid.uuid4()
        with db.begin() as s:
            s.add(Job(id=job_id, user_id=user, job_type="image", status="cancelled",
                      created_at=T0, completed_at=T0))
            credits.grant(s, user, "sub", 30, f"g-sub-{user}", now=T0)
            credits.grant(s, user, "topup", 100, f"g-topup-{user}", now=T0)
            credits.reserve(s, user, job_id, 41, now=T0)
        return job_id

    def commit(job_id: uuid.UUID) -> bool:
        with db.begin() as s:
            return LEDGER.commit(s, job_id, 20, now=T0, record=record)

    def refund(job_id: uuid.UUID) -> bool:
        with db.begin() as s:
            return LEDGER.refund(s, job_id, now=T0)

    ops = (commit, refund) if first == "commit" else (refund, commit)

    def check(job_id: uuid.UUID, out: dict[str, Any]) -> None:
        log, txns, _, _ = _ledger_state(db, job_id)
        done = [v for k, v in out.items() if k != "k" and v == ("ok", True)]
        assert len(done) == 1, out
        if log.status == "refunded":
            assert txns == [("REFUND", 41), ("USAGE", 41)], (out, txns)
            assert "settlement" not in (log.metadata_ or {})
            actual = 0
        else:
            assert txns == [("COMMIT", 20), ("RELEASE", 21), ("USAGE", 41)], (out, txns)
            assert log.metadata_["settlement"] == {**record, "kept": 20}, out
            actual = 20
        with db.begin() as s:
            s.execute(update(Job).where(Job.id == job_id).values(credits_actual=actual))
        _audits_clean(db)

    assert _interleave(engine, setup, ops[0], ops[1], check)
