"""Attack on issue 16's Core ledger: two connections on one hot user, the second operation
started after each statement of the first (A paused there; B runs until it completes or waits on
a lock, seen in ``pg_stat_activity``; then A goes on). The outcome must be one of the two serial
orders exactly (every table's rows), the pools never negative, the audit clean."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits
from reconcile.db.migrate import upgrade
from reconcile.db.models import Job
from reconcile.db.session import make_engine, make_sessionmaker
from reconcile.ledger import DEFAULT as LEDGER
from tests.conftest import PgDatabases
from tests.integration.test_ledger_differential import dump, wipe

T0 = datetime(2026, 1, 1, tzinfo=UTC)
USER = uuid.UUID(int=1)
J1, J2, J3 = uuid.UUID(int=11), uuid.UUID(int=12), uuid.UUID(int=13)


def _setup(factory: sessionmaker[Session]) -> None:
    wipe(factory)
    with factory.begin() as s:
        for j in (J1, J2, J3):
            s.add(Job(id=j, user_id=USER, job_type="t", status="pending"))
    with factory.begin() as s:
        credits.grant(s, USER, "sub", 6, "g-sub", now=T0)
        credits.grant(s, USER, "topup", 6, "g-topup", now=T0)
        credits.grant(s, USER, "sub", 3, "g-sub2", now=T0)
        credits.reserve(s, USER, J1, 8, now=T0)  # sub 6 + sub2 2


def _outcome(fn: Callable[[Session], Any]) -> Callable[[Session], Any]:
    def run(s: Session) -> Any:
        try:
            r = fn(s)
        except Exception as exc:  # noqa: BLE001 - the outcome is compared
            return ("raise", type(exc).__name__)
        return ("ok", (r.amount, r.from_sub, r.from_topup) if hasattr(r, "from_sub") else r)
    return run


OPS: dict[str, Callable[[Session], Any]] = {
    "reserve_j2_6": _outcome(lambda s: LEDGER.reserve(s, USER, J2, 6, now=T0)),
    "reserve_j3_5": _outcome(lambda s: LEDGER.reserve(s, USER, J3, 5, now=T0)),
    "commit_j1_3": _outcome(lambda s: LEDGER.commit(s, J1, 3, now=T0)),
    "commit_j1_all": _outcome(lambda s: LEDGER.commit(s, J1, now=T0)),
    "refund_j1": _outcome(lambda s: LEDGER.refund(s, J1, now=T0)),
    "legacy_j1_4": _outcome(lambda s: credits.import_legacy_refund(s, J1, 4, "legacy-a", now=T0)),
    "grant_topup": _outcome(lambda s: credits.grant(s, USER, "topup", 4, "g-late", now=T0)),
    # a platform's transaction of two calls for one user: the commit, then a bonus
    "commit_j1_all_then_grant": _outcome(lambda s: (
        LEDGER.commit(s, J1, now=T0), credits.grant(s, USER, "topup", 4, "g-bonus", now=T0))),
}
PAIRS = [
    ("reserve_j2_6", "reserve_j3_5"),  # the balance (7) covers one of them only
    ("commit_j1_3", "refund_j1"),
    ("refund_j1", "commit_j1_all"),
    ("commit_j1_3", "reserve_j2_6"),
    ("legacy_j1_4", "commit_j1_all"),
    ("refund_j1", "legacy_j1_4"),
    ("grant_topup", "reserve_j2_6"),
    ("reserve_j2_6", "refund_j1"),
    # every operation takes the user's balance row first, a commit of everything held included:
    # one that took only the job's log would let a writer of the same job take the balance and
    # then wait on the log, reading a stale status (a refund raising instead of returning
    # False), and a transaction calling the ledger again after it would deadlock
    ("commit_j1_all", "refund_j1"),
    ("commit_j1_all", "commit_j1_3"),
    ("commit_j1_all_then_grant", "refund_j1"),
    ("commit_j1_all_then_grant", "legacy_j1_4"),
]


class Pauser:
    """After the ``at``-th statement on a connection marked ``pause_me``, waits for ``go``."""

    def __init__(self, engine: Engine) -> None:
        self.at = 0
        self.count = 0
        self.paused = threading.Event()
        self.go = threading.Event()
        event.listen(engine, "after_cursor_execute", self._after)

    def _after(self, conn: Any, *args: Any) -> None:
        if not conn.info.get("pause_me"):
            return
        self.count += 1
        if self.at and self.count == self.at:
            self.paused.set()
            assert self.go.wait(60)


def _serial(factory: sessionmaker[Session], first: str, second: str) -> tuple[Any, Any, Any]:
    _setup(factory)
    with factory.begin() as s:
        a = OPS[first](s)
    with factory.begin() as s:
        b = OPS[second](s)
    return a, b, dump(factory)


def _b_waits_or_done(engine: Engine, pid: list[int], done: threading.Event) -> bool:
    """True: B waits on a lock (A holds it); False: B completed without waiting."""
    with engine.connect() as probe:
        while not done.is_set():
            if pid:
                waiting = probe.execute(text(
                    "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :p"),
                    {"p": pid[0]}).scalar()
                if waiting:
                    return True
            probe.rollback()
            done.wait(0.005)  # polling an observable condition, not a synchronisation sleep
    return False


@pytest.fixture(scope="module")
def pg(pg_databases: PgDatabases) -> Iterator[tuple[sessionmaker[Session], Engine, Pauser]]:
    url = pg_databases.create("xilv")
    upgrade(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine), engine, Pauser(engine)
    engine.dispose()


@pytest.mark.parametrize(("first", "second"), PAIRS)
def test_interleaved_pair_is_one_of_the_serial_orders(pg: Any, first: str, second: str) -> None:
    factory, engine, pauser = pg
    ab = _serial(factory, first, second)
    ba_b, ba_a, ba_dump = _serial(factory, second, first)
    ba = (ba_a, ba_b, ba_dump)
    # how many statements does A run?
    _setup(factory)
    with factory() as s, s.begin():
        s.connection().info["pause_me"] = True
        pauser.at, pauser.count = 0, 0
        OPS[first](s)
        s.connection().info["pause_me"] = False
    total = pauser.count
    assert total > 0
    waited = []
    for k in range(1, total + 1):
        _setup(factory)
        pauser.at, pauser.count = k, 0
        pauser.paused.clear()
        pauser.go.clear()
        out: dict[str, Any] = {}

        def run_a(out: dict[str, Any] = out) -> None:
            with factory() as s, s.begin():
                s.connection().info["pause_me"] = True
                try:
                    out["a"] = OPS[first](s)
                finally:
                    s.connection().info["pause_me"] = False

        b_pid: list[int] = []
        b_done = threading.Event()

        def run_b(out: dict[str, Any] = out, b_pid: list[int] = b_pid,
                  b_done: threading.Event = b_done) -> None:
            try:
                with factory() as s, s.begin():
                    b_pid.append(s.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar())
                    out["b"] = OPS[second](s)
            finally:
                b_done.set()

        ta = threading.Thread(target=run_a)
        ta.start()
        if not pauser.paused.wait(30):  # A ended before its k-th statement (a shorter path)
            ta.join()
            continue
        tb = threading.Thread(target=run_b)
        tb.start()
        waited.append(_b_waits_or_done(engine, b_pid, b_done))
        pauser.go.set()
        ta.join(60)
        tb.join(60)
        assert not ta.is_alive() and not tb.is_alive()
        got = (out.get("a"), out.get("b"), dump(factory))
        assert got in (ab, ba), (first, second, k, got[:2], ab[:2], ba[:2])
        balances = got[2]["balances"]
        assert all(sub >= 0 and topup >= 0 for _, sub, topup, _ in balances)
        with factory() as s:
            assert credits.audit(s, now=T0) == []
    assert any(waited)  # B really ran while A held the user's balance lock
