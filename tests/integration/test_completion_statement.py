"""The completion as one statement (``reconcile.lifecycle.completion``) against the
two-statement path it replaces, on random ledger histories (PostgreSQL).

Two databases receive the same seeded operations: the ledger's own (grants, reserves, commits for
any amount, refunds, legacy refund imports, re-charges, corrupted usage metadata, a platform's
own reservations: :func:`test_ledger_differential.operations`) interleaved with completions of
the jobs through ``finalize_job_with_media`` at a price the pricing hook gives (none, zero, less
than held, all, more than held) and a platform's stale write-back of a completed row. One side
finalizes with the one statement, the other with the statement switched off (the job's CAS, the
ledger's commit call, then the rows). Every return and raise, every ledger table, the jobs' money
and completion columns, the assets, the events and the anomalies must agree after every step,
and the audit must agree at the end.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, Settings, credits
from reconcile.db.migrate import upgrade
from reconcile.db.models import Job
from reconcile.db.session import make_engine, make_sessionmaker
from reconcile.lifecycle import completion
from reconcile.lifecycle.finalize import finalize_job_with_media
from reconcile.providers import Output
from reconcile.storage import LocalStorage
from tests.conftest import PgDatabases
from tests.integration.test_ledger_differential import (
    N_JOBS,
    N_PLATFORM_JOBS,
    N_USERS,
    Side,
    _fresh,
    _old_guard,
    dump,
    operations,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Ledgerside(Side):
    def __init__(self, name: str, factory: sessionmaker[Session], one_statement: bool,
                 media: Path) -> None:
        class Direct:  # credits.* as the ledger's callers use them
            grant = staticmethod(credits.grant)
            import_legacy_refund = staticmethod(credits.import_legacy_refund)
            recharge = staticmethod(credits.recharge)
            reserve = staticmethod(credits.reserve)
            commit = staticmethod(credits.commit)
            refund = staticmethod(credits.refund)

        super().__init__(name, factory, Direct, False, _old_guard)
        self.one_statement = one_statement
        self.clock = [T0]
        self.rt = Runtime(settings=Settings(database_url="postgresql+psycopg://unused/x"),
                          sessions=factory, storage=LocalStorage(media),
                          clock=lambda: self.clock[0])

    def complete(self, job: uuid.UUID, price: int | None, outputs: int, now: datetime,
                 mp: pytest.MonkeyPatch) -> Any:
        self.clock[0] = now
        self.rt.pricing_hook = None if price is None else (lambda job, result: price)
        with mp.context() as m:
            if not self.one_statement:
                m.setattr(completion, "usable", lambda *a, **k: False)
            try:
                return ("ok", finalize_job_with_media(
                    self.rt, job, None, source="differential",
                    outputs=tuple(Output(data=b"o%d" % i, media_type="image/png")
                                  for i in range(outputs))))
            except Exception as exc:
                if "sqlalchemy" in type(exc).__module__:
                    raise
                return ("raise", type(exc).__name__, getattr(exc, "reason", None))

    def revert(self, job: uuid.UUID) -> Any:
        """A platform's stale ORM save: a completed row written back in flight."""
        with self.factory.begin() as s:
            s.execute(update(Job).where(Job.id == job, Job.status == "completed")
                      .values(status="processing"))
        return ("ok", None)


def _completion_dump(factory: sessionmaker[Session]) -> dict[str, list[tuple[Any, ...]]]:
    out = dump(factory)
    queries = {
        "completed": "SELECT id, status, credits_actual, display_cost, output_data, completed_at, "
                     "progress, next_poll_at, provider, error_code FROM jobs ORDER BY id",
        "assets": 'SELECT job_id, user_id, "index", storage_key, media_type, is_public, '
                  "watermarked, created_at FROM reconcile_assets ORDER BY job_id, \"index\"",
        "events": "SELECT job_id, user_id, type, payload, created_at, published_at "
                  "FROM reconcile_job_events ORDER BY id",
        "all_anomalies": "SELECT job_id, kind, detail FROM reconcile_credit_anomalies "
                         "ORDER BY job_id, kind",
    }
    with factory() as s:
        out.update({name: [tuple(r) for r in s.execute(text(q))] for name, q in queries.items()})
    return out


def _with_completions(seed: int, users: list[uuid.UUID], jobs: list[uuid.UUID],
                      platform_jobs: list[uuid.UUID], n: int) -> Iterator[tuple[Any, ...]]:
    rnd = random.Random(seed * 7919)
    reserved: dict[uuid.UUID, int] = {}
    for op in operations(seed, users, jobs, platform_jobs, n):
        if op[0] == "reserve":
            reserved.setdefault(op[2], op[3])
        yield op
        if rnd.random() < 0.35:
            job = rnd.choice(jobs + platform_jobs)
            a = reserved.get(job, 5)
            price = rnd.choice([None, None, 0, max(0, a - 1), a, a + 1, rnd.randint(0, a)])
            yield ("complete", job, price, rnd.choice([0, 1, 2]))
        if rnd.random() < 0.08:
            yield ("revert", rnd.choice(jobs + platform_jobs))


@pytest.fixture(scope="module")
def two_pg(pg_databases: PgDatabases) -> Iterator[list[sessionmaker[Session]]]:
    engines: list[Engine] = []
    for _ in range(2):
        url = pg_databases.create("xcomplete")
        upgrade(url)
        engines.append(make_engine(url))
    yield [make_sessionmaker(e) for e in engines]
    for e in engines:
        e.dispose()


@pytest.mark.parametrize("seeds", [range(0, 6), range(6, 12)], ids=["seeds0-5", "seeds6-11"])
def test_one_statement_and_two_statement_completions_agree(
        two_pg: list[sessionmaker[Session]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        seeds: range) -> None:
    sides = [Ledgerside("one-statement", two_pg[0], True, tmp_path / "a"),
             Ledgerside("two-statement", two_pg[1], False, tmp_path / "b")]
    kinds_seen: dict[str, int] = {}
    for seed in seeds:
        rnd = random.Random(seed)
        users = [uuid.UUID(int=rnd.getrandbits(128)) for _ in range(N_USERS)]
        jobs = [uuid.UUID(int=rnd.getrandbits(128)) for _ in range(N_JOBS)]
        platform_jobs = [uuid.UUID(int=rnd.getrandbits(128)) for _ in range(N_PLATFORM_JOBS)]
        for side in sides:
            _fresh(side.factory, users, jobs + platform_jobs)
        for step, op in enumerate(_with_completions(seed, users, jobs, platform_jobs, 90)):
            now = T0 + timedelta(seconds=step)
            if op[0] == "complete":
                results = [side.complete(op[1], op[2], op[3], now, monkeypatch) for side in sides]
                kinds_seen[f"complete:{results[0]}"] = kinds_seen.get(f"complete:{results[0]}", 0) + 1
            elif op[0] == "revert":
                results = [side.revert(op[1]) for side in sides]
            else:
                results = [side.run(op, now) for side in sides]
            assert results[1] == results[0], (seed, step, op, results)
            dumps = [_completion_dump(side.factory) for side in sides]
            for name in dumps[0]:
                assert dumps[1][name] == dumps[0][name], (seed, step, op, name)
        audits = []
        for side in sides:
            with side.factory() as s:
                found = credits.audit(s, now=T0 + timedelta(days=1))
                audits.append(sorted((d.kind, str(getattr(d, "job_id", ""))) for d in found))
        assert audits[1] == audits[0], (seed, audits)
    # the histories reach the outcomes that matter: won with the commit, lost, refused
    assert kinds_seen.get("complete:('ok', True)", 0) >= 10, kinds_seen
    assert kinds_seen.get("complete:('ok', False)", 0) >= 10, kinds_seen
    assert any(k.startswith("complete:('raise'") for k in kinds_seen), kinds_seen


def test_the_one_statement_is_what_finalize_runs_on_postgresql(
        two_pg: list[sessionmaker[Session]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a vacuous comparison: the one-statement side does run the statement (and the
    switched-off side does not)."""
    calls: list[uuid.UUID] = []
    real = completion.complete

    def counted(session: Session, job_id: uuid.UUID, **kw: Any) -> Any:
        calls.append(job_id)
        return real(session, job_id, **kw)

    monkeypatch.setattr(completion, "complete", counted)
    side = Ledgerside("one-statement", two_pg[0], True, tmp_path / "c")
    user, job = uuid.uuid4(), uuid.uuid4()
    _fresh(side.factory, [user], [job])
    with side.factory.begin() as s:
        credits.grant(s, user, "sub", 50, "g", now=T0)
        credits.reserve(s, user, job, 30, now=T0)
    assert side.complete(job, None, 1, T0, monkeypatch) == ("ok", True)
    assert calls == [job]
    with side.factory() as s:
        row = s.get(Job, job)
        assert row is not None and (row.status, row.credits_actual) == ("completed", 30)


def test_the_one_statement_fits_psycopgs_statement_cache(
        two_pg: list[sessionmaker[Session]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg keeps a statement's parsing (its placeholders turned into ``$n``) only for
    statements of at most ``MAX_CACHED_STATEMENT_LENGTH`` bytes: a longer one is parsed again on
    every execution. The completion runs once per job, so its statement, as the driver receives
    it (the in-flight statuses expanded), stays within that length."""
    from psycopg import _queries
    from sqlalchemy import event

    side = Ledgerside("one-statement", two_pg[0], True, tmp_path / "d")
    sent: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if "reconcile_ledger_commit" in statement and statement.lstrip().startswith("WITH"):
            sent.append(statement)

    engine = side.factory.kw["bind"]
    event.listen(engine, "before_cursor_execute", seen)
    try:
        users, jobs = [uuid.uuid4()], [uuid.uuid4(), uuid.uuid4()]
        _fresh(side.factory, users, jobs)
        with side.factory.begin() as s:
            credits.grant(s, users[0], "sub", 50, "g", now=T0)
            for job in jobs:
                credits.reserve(s, users[0], job, 10, now=T0)
        for job in jobs:
            assert side.complete(job, None, 1, T0, monkeypatch) == ("ok", True)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert len(sent) == 2 and sent[0] == sent[1]
    size = len(sent[0].encode())
    assert size <= _queries.MAX_CACHED_STATEMENT_LENGTH, size
