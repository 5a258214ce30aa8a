"""The pool pings a PostgreSQL connection only after it lay idle (``db.session._ping_when_idle``).

Against the real server: a backend terminated while its connection lies idle in the pool is
found at checkout and replaced, so the caller's transaction runs; a connection used again
within the window is handed out without a ping (no round trip); and one that dies within the
window fails its statement, the trade-off the module documents.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from reconcile.db.session import make_engine

from ..conftest import _admin


def _pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(pid: int) -> None:
    with _admin() as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        for _ in range(200):  # gone from pg_stat_activity: the socket is closed
            if admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is None:
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} still there")


@pytest.fixture
def pings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every ping the dialect sends, counted (the PostgreSQL dialect class's ``do_ping``)."""
    seen: list[int] = []
    engine = make_engine("postgresql+psycopg://x@127.0.0.1/x")  # no connection made
    dialect_cls = type(engine.dialect)
    original = dialect_cls.do_ping

    def counted(self, dbapi_conn):  # type: ignore[no-untyped-def]
        seen.append(1)
        return original(self, dbapi_conn)

    monkeypatch.setattr(dialect_cls, "do_ping", counted)
    return seen


@pytest.fixture
def idle_engine(pg_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_url, pool_size=1, max_overflow=0, ping_after_idle=0.2)
    yield engine
    engine.dispose()


def test_a_connection_used_again_within_the_window_is_not_pinged(idle_engine: Engine,
                                                                 pings: list[int]) -> None:
    first = _pid(idle_engine)  # a new connection: alive, no ping
    for _ in range(20):
        assert _pid(idle_engine) == first
    assert pings == []


def test_a_connection_idle_past_the_window_is_pinged(idle_engine: Engine,
                                                     pings: list[int]) -> None:
    first = _pid(idle_engine)
    time.sleep(0.3)
    assert _pid(idle_engine) == first
    assert len(pings) == 1
    assert _pid(idle_engine) == first  # used just now: no second ping
    assert len(pings) == 1


def test_a_backend_killed_while_idle_is_replaced_before_the_caller_sees_it(
        idle_engine: Engine, pings: list[int]) -> None:
    dead = _pid(idle_engine)
    _terminate(dead)
    time.sleep(0.3)
    with idle_engine.begin() as conn:  # the ping finds it dead; a new connection serves
        alive = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
    assert alive != dead
    assert len(pings) == 1


def test_a_backend_killed_within_the_window_fails_the_statement(idle_engine: Engine,
                                                                pings: list[int]) -> None:
    dead = _pid(idle_engine)
    _terminate(dead)
    with pytest.raises(OperationalError), idle_engine.connect() as conn:
        conn.execute(text("SELECT 1"))
    assert pings == []
    assert _pid(idle_engine) != dead  # the pool was invalidated: the next checkout is new


def test_pool_pre_ping_given_keeps_sqlalchemys_ping_at_every_checkout(pg_url: str,
                                                                      pings: list[int]) -> None:
    engine = make_engine(pg_url, pool_size=1, max_overflow=0, pool_pre_ping=True)
    try:
        _pid(engine)
        _pid(engine)
        _pid(engine)
    finally:
        engine.dispose()
    assert len(pings) == 2  # every checkout of the pooled connection after the first



def test_pool_pre_ping_false_given_turns_every_ping_off(pg_url: str, pings: list[int]) -> None:
    engine = make_engine(pg_url, pool_size=1, max_overflow=0, pool_pre_ping=False,
                         ping_after_idle=0.0)
    try:
        _pid(engine)
        time.sleep(0.05)
        _pid(engine)
    finally:
        engine.dispose()
    assert pings == []
