"""One-statement transactions (``reconcile.db.session.one_statement``): on PostgreSQL the
statement commits itself (autocommit), one round trip instead of three, and the connection goes
back to the pool as an ordinary one.

Round trips are counted by libpq itself (``PQtrace`` on each pooled connection): every
``ReadyForQuery`` the server sends ends one, and a ``BEGIN`` or ``COMMIT`` is a query of its
own, so neither the library nor SQLAlchemy says what is counted.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from psycopg import pq
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, lifecycle
from reconcile.db.models import JobEvent
from reconcile.db.session import make_engine, make_sessionmaker, one_statement
from reconcile.storage import LocalStorage
from reconcile.testing.simulator import Simulator
from tests.integration.harness import fund


class Trace:
    """libpq's protocol trace of every connection checked out of ``engine`` while active."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.file = tempfile.TemporaryFile()
        self.traced: list[Any] = []

    def _checkout(self, dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        pgconn = dbapi_conn.pgconn
        if any(p is pgconn for p in self.traced):
            return
        pgconn.trace(self.file.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        self.traced.append(pgconn)

    def lines(self) -> list[str]:
        self.file.seek(0)
        return self.file.read().decode(errors="replace").splitlines()

    def round_trips(self) -> int:
        return sum(1 for line in self.lines() if "\tReadyForQuery\t" in line)

    def queries(self, name: str) -> int:
        """Simple-protocol queries that are ``name`` (a BEGIN may carry an isolation level:
        SQLAlchemy restores the engine's after an autocommit checkout)."""
        return sum(1 for line in self.lines()
                   if f'\tQuery\t "{name}"' in line or f'\tQuery\t "{name} ' in line)


@contextmanager
def traced(engine: Engine) -> Iterator[Trace]:
    """Counted once the block ends (libpq buffers the trace until ``PQuntrace``)."""
    trace = Trace(engine)
    event.listen(engine, "checkout", trace._checkout)
    try:
        yield trace
    finally:
        event.remove(engine, "checkout", trace._checkout)
        for pgconn in trace.traced:
            pgconn.untrace()


@pytest.fixture
def one_connection(pg_url: str, db: sessionmaker[Session]) -> Iterator[Engine]:
    """An engine of ONE pooled connection: whatever a block leaves on it, the next one gets."""
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)
    yield engine
    engine.dispose()


def _events(engine: Engine, job_id: uuid.UUID) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM reconcile_job_events WHERE job_id = :j"),
                                {"j": job_id}).scalar_one())


def test_the_statement_commits_itself_in_one_round_trip(one_connection: Engine) -> None:
    factory = make_sessionmaker(one_connection)
    with factory() as warm:  # connected (and put in UTC) before the count
        warm.execute(text("SELECT 1"))
    with traced(one_connection) as trace, one_statement(factory) as session:
        assert session.connection().connection.dbapi_connection.autocommit is True
        session.execute(text("SELECT 1"))
    assert (trace.queries("BEGIN"), trace.queries("COMMIT")) == (0, 0), trace.lines()
    assert trace.round_trips() == 1, trace.lines()
    with traced(one_connection) as trace, factory.begin() as session:  # ordinary: three
        session.execute(text("SELECT 1"))
    assert (trace.queries("BEGIN"), trace.queries("COMMIT")) == (1, 1), trace.lines()
    assert trace.round_trips() == 3, trace.lines()


def test_the_connection_returns_to_the_pool_as_an_ordinary_one(one_connection: Engine) -> None:
    """After a one-statement block, the same pooled connection runs the next transaction with
    BEGIN and COMMIT: two statements then roll back together."""
    factory = make_sessionmaker(one_connection)
    job_id = uuid.uuid4()
    with one_statement(factory) as session:
        session.execute(text("SELECT 1"))
    with pytest.raises(RuntimeError, match="after the first insert"):
        with factory.begin() as session:
            dbapi = session.connection().connection.dbapi_connection
            assert dbapi.autocommit is False
            for kind in ("a", "b"):
                session.execute(text(
                    "INSERT INTO reconcile_job_events (event_id, job_id, user_id, type, payload, "
                    "created_at) VALUES (:e, :j, :u, :t, '{}', now())"),
                    {"e": uuid.uuid4(), "j": job_id, "u": uuid.uuid4(), "t": kind})
                raise RuntimeError("after the first insert")
    assert _events(one_connection, job_id) == 0  # rolled back: not autocommitted


def test_changes_left_for_the_flush_are_refused_and_nothing_is_written(
        one_connection: Engine) -> None:
    factory = make_sessionmaker(one_connection)
    job_id = uuid.uuid4()
    with pytest.raises(RuntimeError, match="left changes for the session to write"):
        with one_statement(factory) as session:
            session.execute(text("SELECT 1"))
            session.add(JobEvent(event_id=uuid.uuid4(), job_id=job_id, user_id=uuid.uuid4(),
                                 type="queued", payload={}))
    assert _events(one_connection, job_id) == 0


def test_a_statement_that_fails_writes_nothing(one_connection: Engine) -> None:
    factory = make_sessionmaker(one_connection)
    job_id = uuid.uuid4()
    with pytest.raises(Exception, match="division by zero"):
        with one_statement(factory) as session:
            session.execute(text(
                "INSERT INTO reconcile_job_events (event_id, job_id, user_id, type, payload, "
                "created_at) SELECT :e, :j, :u, 'queued', '{}', now() WHERE 1 / 0 = 1"),
                {"e": uuid.uuid4(), "j": job_id, "u": uuid.uuid4()})
    assert _events(one_connection, job_id) == 0
    with factory.begin() as session:  # the connection is usable, and ordinary again
        assert session.connection().connection.dbapi_connection.autocommit is False


def test_the_create_step_claims_and_saves_in_one_round_trip_each(
        one_connection: Engine, tmp_path: Path) -> None:
    """The create's claim and its id save are one statement each: two round trips in all
    (six with BEGIN and COMMIT around each), and the job is accepted."""
    factory = make_sessionmaker(one_connection)
    clock = [0.0]
    with Simulator(clock=lambda: clock[0]) as sim:
        rt = Runtime(settings=sim.settings(webhook_base_url="https://platform.example/hooks"),
                     sessions=factory, storage=LocalStorage(tmp_path / "media"))
        creates: list[uuid.UUID] = []
        rt.enqueue_create = lambda job_id, countdown=0.0: creates.append(job_id)
        user = uuid.uuid4()
        fund(factory, user)
        lifecycle.submit_job(rt, user, "kie-standard", "m", {"prompt": "a cat"}, 10,
                             job_type="image")
        with traced(one_connection) as trace:
            assert lifecycle.create_step(rt, creates.pop()).action == "accepted"
    assert (trace.queries("BEGIN"), trace.queries("COMMIT")) == (0, 0), trace.lines()
    assert trace.round_trips() == 2, trace.lines()


def test_a_pending_object_is_not_autoflushed_by_the_statement(one_connection: Engine) -> None:
    """An object added before the block's statement is not written by it (no autoflush in
    autocommit): the block is refused and nothing at all is written."""
    factory = make_sessionmaker(one_connection)
    job_id = uuid.uuid4()
    with pytest.raises(RuntimeError, match="left changes for the session to write"):
        with one_statement(factory) as session:
            session.add(JobEvent(event_id=uuid.uuid4(), job_id=job_id, user_id=uuid.uuid4(),
                                 type="queued", payload={}))
            session.execute(text("SELECT count(*) FROM reconcile_job_events"))
    assert _events(one_connection, job_id) == 0


@pytest.mark.parametrize("outer", [False, True], ids=["connection", "inside_its_transaction"])
def test_a_sessionmaker_bound_to_a_connection_gets_an_ordinary_transaction(
        one_connection: Engine, outer: bool) -> None:
    """A connection never goes back to a pool, so nothing would restore its isolation level:
    ``one_statement`` runs an ordinary transaction on it (BEGIN and COMMIT, or the caller's
    transaction), and the connection's next transaction still rolls back as a whole."""
    job_id = uuid.uuid4()
    with one_connection.connect() as conn:
        if outer:
            conn.begin()
        factory = sessionmaker(bind=conn, expire_on_commit=False,
                               join_transaction_mode="create_savepoint")
        with one_statement(factory) as session:
            assert session.connection().connection.dbapi_connection.autocommit is False
            session.execute(text("SELECT 1"))
        with pytest.raises(RuntimeError, match="after the insert"):
            with factory.begin() as session:
                session.execute(text(
                    "INSERT INTO reconcile_job_events (event_id, job_id, user_id, type, payload, "
                    "created_at) VALUES (:e, :j, :u, 'queued', '{}', now())"),
                    {"e": uuid.uuid4(), "j": job_id, "u": uuid.uuid4()})
                raise RuntimeError("after the insert")
        if outer:
            conn.rollback()
    assert _events(one_connection, job_id) == 0
