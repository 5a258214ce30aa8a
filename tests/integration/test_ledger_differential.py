"""Attack on issue 16's Core ledger: the old ORM ledger (main's ``credits.py``, kept as the
scratch module ``_old_credits``) and the new one driven by the same seeded operation sequences on
fresh databases; every table's rows and every return/raise must agree, and the audit stay clean.

Three databases per backend: the old ledger behind the old ``BuiltinLedger`` (a SAVEPOINT per
reserve/commit/refund), the new one behind the new ``BuiltinLedger`` (no SAVEPOINT on
PostgreSQL), and the new ``credits.*`` functions called directly (the documented "every error is
raised before the operation's first write"). Every step runs in its own transaction and an error
is caught inside it, then the transaction is committed anyway: the caller goes on.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits as new_credits
from reconcile.db.migrate import upgrade
from reconcile.db.models import Job, UsageLog
from reconcile.db.session import make_engine, make_sessionmaker
from reconcile.ledger import DEFAULT as NEW_LEDGER
from tests.conftest import TABLES, PgDatabases
from tests.integration import _old_credits as old_credits

T0 = datetime(2026, 1, 1, tzinfo=UTC)
N_USERS = 2
N_JOBS = 10
N_PLATFORM_JOBS = 3


class Side:
    """One database and the way operations reach its ledger."""

    def __init__(self, name: str, factory: sessionmaker[Session], mod: Any, guarded: bool,
                 guard: Callable[[Session], Any]) -> None:
        self.name, self.factory, self.mod, self.guarded, self.guard = name, factory, mod, guarded, guard

    def run(self, op: tuple[Any, ...], now: datetime) -> Any:
        kind, *args = op
        m = self.mod
        try:
            with self.factory() as s, s.begin():
                try:
                    if kind == "grant":
                        return ("ok", m.grant(s, *args, now=now))
                    if kind == "import":
                        return ("ok", m.import_legacy_refund(s, *args, now=now))
                    if kind == "recharge":
                        if _committed(s, args[0]):
                            # issue 24 (finding 4): a job whose commit released credits (a
                            # partial settlement) can be re-charged now; the old ledger has no
                            # such rule to agree with (tests/integration/test_settle_owed.py)
                            return ("ok", "not compared")
                        if args[1] > new_credits.returned(s, args[0]):
                            # issue 24 attack: a re-charge never takes back more than the
                            # settlement returned (test_money_rules_as_configured.py); the old
                            # ledger took any amount
                            return ("ok", "not compared")
                        return ("ok", m.recharge(s, *args, now=now))
                    if kind == "corrupt":
                        job, meta = args
                        s.execute(update(UsageLog).where(UsageLog.job_id == job).values(metadata_=meta))
                        return ("ok", None)
                    if kind == "platform":
                        job, user, amount, meta = args
                        s.execute(insert(UsageLog).values(
                            id=uuid.uuid5(job, "log"), job_id=job, user_id=user, status="reserved",
                            credits=amount, metadata_=meta, created_at=now))
                        return ("ok", None)
                    with self.guard(s) if self.guarded else nullcontext():
                        if kind == "reserve":
                            r = m.reserve(s, *args, now=now)
                            return ("ok", (r.amount, r.from_sub, r.from_topup))
                        if kind == "commit":
                            return ("ok", m.commit(s, *args, now=now))
                        if kind == "refund":
                            return ("ok", m.refund(s, *args, now=now))
                    raise AssertionError(kind)
                except Exception as exc:  # the caller catches and goes on
                    if "sqlalchemy" in type(exc).__module__:
                        raise
                    return ("raise", type(exc).__name__, getattr(exc, "reason", None))
        except Exception as exc:  # the transaction itself failed (a database error)
            return ("txn-failed", type(exc).__name__)


def dump(factory: sessionmaker[Session]) -> dict[str, list[tuple[Any, ...]]]:
    queries = {
        "balances": "SELECT user_id, sub, topup, updated_at FROM reconcile_credit_balances ORDER BY user_id",
        "lots": "SELECT id, user_id, pool, kind, source_txn_id, amount, remaining_amount, created_at "
                "FROM reconcile_credit_lots ORDER BY id",
        "txns": "SELECT id, user_id, job_id, type, amount, from_sub, from_topup, created_at "
                "FROM reconcile_credit_transactions ORDER BY id",
        "usage_logs": "SELECT job_id, user_id, status, credits, metadata, created_at FROM usage_logs "
                      "ORDER BY job_id, created_at",
        "anomalies": "SELECT job_id, user_id, kind, detail FROM reconcile_credit_anomalies "
                     "ORDER BY job_id, kind",
        "jobs": "SELECT id, credits_actual, display_cost FROM jobs ORDER BY id",
    }
    with factory() as s:
        out = {name: [tuple(r) for r in s.execute(text(q))] for name, q in queries.items()}
    # a balance row created by a lock carries the server's now(), not the operation's
    out["balances"] = [(u, sub, topup, at if str(at).startswith("2026-01") else "server-now")
                       for u, sub, topup, at in out["balances"]]
    return out


def _committed(s: Session, job: uuid.UUID) -> bool:
    """The job's first usage log is committed (every side holds the same rows)."""
    status = s.execute(select(UsageLog.status).where(UsageLog.job_id == job)
                       .order_by(UsageLog.created_at, UsageLog.id).limit(1)).scalar_one_or_none()
    return status == "committed"


def operations(seed: int, users: list[uuid.UUID], jobs: list[uuid.UUID],
               platform_jobs: list[uuid.UUID], n: int) -> Iterator[tuple[Any, ...]]:
    rnd = random.Random(seed)
    owner = {j: users[i % len(users)] for i, j in enumerate(jobs + platform_jobs)}
    reserved: dict[uuid.UUID, int] = {}
    grants = [f"g-{k}" for k in range(12)]
    legacy = [f"legacy-{k}" for k in range(6)]
    platform_left = list(platform_jobs)
    last: tuple[Any, ...] | None = None
    for _ in range(n):
        if last is not None and rnd.random() < 0.15:
            yield last  # repeat the previous operation exactly (idempotency)
            continue
        kind = rnd.choices(["grant", "reserve", "commit", "refund", "import", "recharge", "corrupt",
                            "platform"], [4, 6, 5, 3, 3, 1, 0.3, 0.3])[0]
        job = rnd.choice(jobs)
        if kind == "grant":
            op: tuple[Any, ...] = ("grant", rnd.choice(users), rnd.choice(["sub", "topup"]),
                                   rnd.randint(1, 60), rnd.choice(grants))
        elif kind == "reserve":
            amount = rnd.randint(1, 80)
            reserved.setdefault(job, amount)
            op = ("reserve", owner[job], job, amount)
        elif kind == "commit":
            job = rnd.choice(jobs + platform_jobs)
            a = reserved.get(job, 5)
            op = ("commit", job, rnd.choice([None, 0, 1, max(0, a - 1), a, a + 1, rnd.randint(0, a),
                                             -1]))
        elif kind == "refund":
            op = ("refund", rnd.choice(jobs + platform_jobs))
        elif kind == "import":
            a = reserved.get(job, 5)
            op = ("import", job, rnd.choice([1, 2, max(1, a // 2), a, a + 1]), rnd.choice(legacy))
        elif kind == "recharge":
            op = ("recharge", job, rnd.randint(1, 50))
        elif kind == "corrupt":
            op = ("corrupt", job, rnd.choice(['"junk"', [1, 2], 7, None]))
        else:
            if not platform_left:
                continue
            pj = platform_left.pop()
            a = rnd.randint(1, 20)
            reserved[pj] = a
            op = ("platform", pj, owner[pj], a, rnd.choice([None, {"from_sub": a, "from_topup": 0},
                                                            {"note": "x"}]))
        last = op
        yield op


def _fresh(factory: sessionmaker[Session], users: list[uuid.UUID], jobs: list[uuid.UUID]) -> None:
    wipe(factory)
    with factory.begin() as s:
        for i, j in enumerate(jobs):
            s.add(Job(id=j, user_id=users[i % len(users)], job_type="t", status="pending"))


def wipe(factory: sessionmaker[Session]) -> None:
    with factory.begin() as s:
        if s.get_bind().dialect.name == "postgresql":
            s.execute(text("TRUNCATE " + ", ".join(TABLES) + " RESTART IDENTITY"))
        else:
            for table in TABLES:
                s.execute(text(f"DELETE FROM {table}"))


def _old_guard(s: Session) -> Any:
    return s.begin_nested()  # main's BuiltinLedger: a SAVEPOINT around each operation


def _sides(factories: list[sessionmaker[Session]]) -> list[Side]:
    class NewLedgerMod:  # the new BuiltinLedger for reserve/commit/refund, credits.* for the rest
        grant = staticmethod(new_credits.grant)
        import_legacy_refund = staticmethod(new_credits.import_legacy_refund)
        recharge = staticmethod(new_credits.recharge)
        reserve = staticmethod(NEW_LEDGER.reserve)
        commit = staticmethod(NEW_LEDGER.commit)
        refund = staticmethod(NEW_LEDGER.refund)

    return [Side("old+savepoint", factories[0], old_credits, True, _old_guard),
            Side("new-ledger", factories[1], NewLedgerMod, False, _old_guard),
            Side("new-direct", factories[2], new_credits, False, _old_guard)]


def differential(factories: list[sessionmaker[Session]], seeds: range, n: int) -> None:
    sides = _sides(factories)
    for seed in seeds:
        rnd = random.Random(seed)
        users = [uuid.UUID(int=rnd.getrandbits(128)) for _ in range(N_USERS)]
        jobs = [uuid.UUID(int=rnd.getrandbits(128)) for _ in range(N_JOBS)]
        platform_jobs = [uuid.UUID(int=rnd.getrandbits(128)) for _ in range(N_PLATFORM_JOBS)]
        for side in sides:
            _fresh(side.factory, users, jobs + platform_jobs)
        for step, op in enumerate(operations(seed, users, jobs, platform_jobs, n)):
            now = T0 + timedelta(seconds=step)
            results = [side.run(op, now) for side in sides]
            assert results[1] == results[0] and results[2] == results[0], (seed, step, op, results)
            dumps = [dump(side.factory) for side in sides]
            for name in dumps[0]:
                assert dumps[1][name] == dumps[0][name], (seed, step, op, "new-ledger", name)
                assert dumps[2][name] == dumps[0][name], (seed, step, op, "new-direct", name)
        audits = []
        for side in sides:
            with side.factory() as s:
                found = new_credits.audit(s, now=T0 + timedelta(seconds=n + 1))
                audits.append(sorted((d.kind, str(getattr(d, "job_id", ""))) for d in found))
        assert audits[1] == audits[0] and audits[2] == audits[0], (seed, audits)
        if not any(op[0] in ("platform", "corrupt") for op in operations(
                seed, users, jobs, platform_jobs, n)):
            assert audits[0] == [], (seed, audits[0])


@pytest.fixture(scope="module")
def three_pg(pg_databases: PgDatabases) -> Iterator[list[sessionmaker[Session]]]:
    engines: list[Engine] = []
    for _ in range(3):
        url = pg_databases.create("xdiff")
        upgrade(url)
        engines.append(make_engine(url))
    yield [make_sessionmaker(e) for e in engines]
    for e in engines:
        e.dispose()


def test_old_and_new_ledger_agree_on_postgresql(three_pg: list[sessionmaker[Session]]) -> None:
    differential(three_pg, range(0, 8), 100)


def test_old_and_new_ledger_agree_on_sqlite(tmp_path: Path) -> None:
    factories = []
    for k in range(3):
        url = f"sqlite:///{tmp_path / f'l{k}.db'}"
        upgrade(url)
        factories.append(make_sessionmaker(make_engine(url)))
    differential(factories, range(100, 106), 120)
