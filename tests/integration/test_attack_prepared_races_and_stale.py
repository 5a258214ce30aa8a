"""The prepared CAS statements' caches filled by many threads at once (every thread's first
call on an empty cache), and the row a prepared CAS returns when the session had loaded it
before (populate_existing), on PostgreSQL and SQLite."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore
from reconcile.db.migrate import upgrade
from reconcile.db.models import Job, JobEvent
from reconcile.db.session import make_engine, make_sessionmaker
from reconcile.jobstore import cas
from reconcile.states import Submission
from tests.conftest import PgDatabases
from tests.integration._platform_db import clean_sessions

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module", params=["pg", "sqlite"])
def sessions(request: pytest.FixtureRequest, pg_databases: PgDatabases,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[sessionmaker[Session]]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('prep')}/r.db"
        upgrade(url)
        engine = make_engine(url)
        yield make_sessionmaker(engine)
    else:
        url = pg_databases.create("prepraces")
        upgrade(url)
        engine = make_engine(url, pool_size=10, max_overflow=10)
        yield clean_sessions(engine)
    engine.dispose()


def _insert(sessions: sessionmaker[Session], **values: Any) -> uuid.UUID:
    job_id = uuid.uuid4()
    base = dict(id=job_id, user_id=uuid.UUID(int=7), job_type="image", status="pending",
                provider_kind="a", submission_state=Submission.NOT_STARTED)
    base.update(values)
    with sessions.begin() as s:
        s.add(Job(**base))
    return job_id


def _clear() -> None:
    cas._PREPARED.clear()


def _all_five(sessions: sessionmaker[Session], n: int) -> list[Any]:
    """claim_create (both shapes), save_task_id, claim_attempt, make_due, hold_while_storing
    on its own row; what each returned."""
    pg = sessions.kw["bind"].dialect.name == "postgresql"
    ids = [_insert(sessions) for _ in range(2)]
    saved = _insert(sessions, submission_state=Submission.SUBMITTING, claim_token="tok")
    attempt = _insert(sessions, status="processing", provider_task_id="t")
    due = _insert(sessions, status="processing", provider_task_id="t")
    hold = _insert(sessions, status="processing", provider_task_id="t", poll_generation=2,
                   poll_seq=1, poll_due_at=T0)
    out: list[Any] = []
    with sessions.begin() as s:
        out.append(jobstore.claim_create(s, ids[0], f"tok{n}", T0, timedelta(minutes=1)))
        out.append(jobstore.claim_create(s, ids[1], f"tok{n}", T0, timedelta(minutes=1),
                                         kinds=["a"], worker=f"w{n}"))
        event = JobEvent(event_id=str(uuid.uuid4()), job_id=saved, user_id=uuid.UUID(int=7),
                         type="running", payload={}, created_at=T0, published_at=None)
        out.append(jobstore.save_task_id(s, saved, "tok", f"task{n}", T0, timedelta(minutes=2),
                                         event=event if pg else None))
        out.append(jobstore.claim_attempt(s, attempt, T0, timedelta(seconds=10)))
        out.append(jobstore.make_due(s, due, T0, timedelta(minutes=1)))
        out.append(jobstore.hold_while_storing(s, hold, T0 + timedelta(minutes=5),
                                               claim=(2, 1), now=T0))
        out.append(jobstore.hold_while_storing(s, hold, T0 + timedelta(minutes=6),
                                               claim=(2, 1), now=T0, counted=True))
        for job in out[:5]:
            assert job is not None
        assert out[0].claim_token == f"tok{n}" and out[1].claimed_by == f"w{n}"
        assert out[2].provider_task_id == f"task{n}"
        assert out[5] is True and out[6] is True
        row = s.execute(select(Job).where(Job.id == hold)
                        .execution_options(populate_existing=True)).scalar_one()
        assert row.storing_count == 1
        assert row.storing_until == T0 + timedelta(minutes=6)
        assert row.poll_due_at == T0 + timedelta(minutes=6)
    return out


@pytest.mark.parametrize("round_", range(5))
def test_first_calls_from_many_threads_at_once(sessions: sessionmaker[Session],
                                               round_: int) -> None:
    threads_n = 8 if sessions.kw["bind"].dialect.name == "postgresql" else 3
    _clear()
    barrier = threading.Barrier(threads_n)
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            barrier.wait()
            _all_five(sessions, n)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    # one statement per (build, shape): claim, claim with kinds, attempt, make_due returning
    # the row; two storing-mark shapes; the save with its event (SQLite: a CAS, then the ORM's
    # event row)
    built = Counter(build.__name__ for build, _ in cas._PREPARED)
    pg = sessions.kw["bind"].dialect.name == "postgresql"
    assert built == ({"_returning": 4, "_plain": 2, "_with_event": 1} if pg
                     else {"_returning": 5, "_plain": 2}), built


def test_the_returned_row_is_fresh_when_the_session_loaded_it_first(
        sessions: sessionmaker[Session]) -> None:
    pg = sessions.kw["bind"].dialect.name == "postgresql"
    job_id = _insert(sessions)
    with sessions.begin() as s:
        before = s.get(Job, job_id)
        assert before is not None and before.claim_token is None
        got = jobstore.claim_create(s, job_id, "tok", T0, timedelta(minutes=1), kinds=["a"],
                                    worker="w")
        assert got is before
        assert (got.submission_state, got.claim_token, got.claimed_by) == (
            Submission.SUBMITTING, "tok", "w")
        assert got.started_at == T0 and got.provider_call_started_at == T0
        event = JobEvent(event_id=str(uuid.uuid4()), job_id=job_id, user_id=uuid.UUID(int=7),
                         type="running", payload={}, created_at=T0, published_at=None)
        got = jobstore.save_task_id(s, job_id, "tok", "task", T0, timedelta(minutes=2),
                                    event=event if pg else None)
        assert got is before and got.provider_task_id == "task"
        assert got.poll_lease_expires_at == T0 + timedelta(minutes=2)
        got = jobstore.claim_attempt(s, job_id, T0, timedelta(seconds=10))
        assert got is before and got.reconcile_attempts == 1
        assert got.reconcile_last_attempt_at == T0
        got = jobstore.make_due(s, job_id, T0 + timedelta(seconds=1), timedelta(minutes=1))
        assert got is before and got.poll_due_at == T0 + timedelta(seconds=1)
        assert got.poll_generation == 2 and got.poll_seq == 0
