"""Attacks on the idle-only checkout ping (``db.session._ping_when_idle``).

Each test here failed on the first version of that ping, which timed a connection's idleness
from its checkin (so a connection held unused by its caller counted as fresh) and refused the
option on SQLite; each states what ``pool_pre_ping=True``, which the ping replaced, gave, or
what the documentation promises.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text

from reconcile.db.session import make_engine

from ..conftest import _admin, pg_url_for


def _terminate(pid: int) -> None:
    with _admin() as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        for _ in range(200):
            if admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is None:
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} still there")


@pytest.fixture
def idle_timeout_db() -> Iterator[str]:
    """A throwaway database whose sessions the server ends after 2 s idle (``idle_session_timeout``,
    PostgreSQL 14+): a pooler's or firewall's idle timeout, longer than ``PING_AFTER_IDLE``."""
    name = f"atk_ping_idle_{uuid.uuid4().hex[:8]}"
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        admin.execute(f"ALTER DATABASE \"{name}\" SET idle_session_timeout = '2s'")
    try:
        yield pg_url_for(name)
    finally:
        with _admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _held_idle_then_reused(engine: Engine, kill: bool, hold: float) -> int:
    """Check a connection out, finish a transaction on it (commit: the session is idle, not in a
    transaction), keep it checked out but unused for ``hold`` seconds (killing its backend
    meanwhile if ``kill``), return it, and at once run a transaction: the pid that served it."""
    with engine.connect() as conn:
        pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        conn.commit()
        if kill:
            _terminate(pid)
        time.sleep(hold)
    # checked in just now: the idle stamp says "fresh", though the session has been idle
    # (and dead) for longer than the window
    with engine.begin() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_a_connection_that_died_while_checked_out_but_idle_is_replaced(pg_url: str) -> None:
    """The stamp is taken at checkin, not at the connection's last use. A connection held checked
    out but unused (``engine.connect()`` with commit-as-you-go, a worker holding its connection
    across a slow platform call) whose backend dies during that idle time is returned to the pool
    without error (psycopg's rollback of an IDLE session sends nothing), stamped "idle since now",
    and handed to the next caller without a ping: the caller's transaction fails, although the
    connection lay idle far longer than PING_AFTER_IDLE. ``pool_pre_ping=True`` (the replaced
    default) pinged it and served the transaction on a new connection; the docstring says a dead
    connection fails its statement only if it died "while it is in use, or within ``seconds`` of
    its last use"."""
    for kwargs in ({"pool_pre_ping": True}, {"ping_after_idle": 0.2}):
        engine = make_engine(pg_url, pool_size=1, max_overflow=0, **kwargs)
        try:
            _held_idle_then_reused(engine, kill=True, hold=0.5)  # must not raise
        finally:
            engine.dispose()


def test_a_server_idle_timeout_longer_than_the_window_never_reaches_the_caller(
        idle_timeout_db: str) -> None:
    """The scenario the change names (a pooler's / server's idle timeout), with the default window
    (1 s) and a server idle timeout of 2 s: the session is idle 2.5 s, so the server ends it, but
    the time was spent checked out rather than in the pool, so the next checkout is not pinged and
    the caller's transaction fails with "terminating connection due to idle-session timeout"."""
    engine = make_engine(idle_timeout_db, pool_size=1, max_overflow=0)  # default PING_AFTER_IDLE
    try:
        _held_idle_then_reused(engine, kill=False, hold=2.5)  # must not raise
    finally:
        engine.dispose()


def test_ping_after_idle_is_accepted_for_a_sqlite_url(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The how-to documents ``make_engine(url, ..., ping_after_idle=...)`` as the knob for the
    window, but the SQLite branch returns before the option is popped, so create_engine rejects
    it (TypeError: Invalid argument(s) 'ping_after_idle'): the same configuration cannot be passed
    to both backends the library supports."""
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}", ping_after_idle=0.5)
    engine.dispose()
