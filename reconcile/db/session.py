"""Engines and sessions: one engine per process, one session per unit of work.

SQLite (the embedded default) is opened in WAL mode with a busy timeout, and every
transaction starts with ``BEGIN IMMEDIATE`` so several worker processes can share the file
without "database is locked" upgrades mid-transaction. On SQLite the write lock taken by
``BEGIN IMMEDIATE`` is what ``SELECT … FOR UPDATE`` gives on PostgreSQL.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

__all__ = [
    "dispose_engines", "engine_for", "make_engine", "make_sessionmaker", "normalise_url",
    "session_scope",
]

SQLITE_BUSY_TIMEOUT_MS = 30_000


def normalise_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str, **kwargs: Any) -> Engine:
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs)
        _configure_sqlite(engine)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 5)
    kwargs.setdefault("max_overflow", 5)
    return create_engine(url, **kwargs)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


_ENGINES: dict[tuple[int, str], Engine] = {}


def engine_for(url: str) -> Engine:
    """The engine for ``url`` in this process (a forked child builds its own: pid in the key)."""
    key = (os.getpid(), url)
    engine = _ENGINES.get(key)
    if engine is None:
        engine = _ENGINES[key] = make_engine(url)
    return engine


def dispose_engines() -> None:
    """Forget engines inherited from a parent process (``worker_process_init``)."""
    for engine in _ENGINES.values():
        engine.dispose(close=False)
    _ENGINES.clear()


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success, rolls back on error, and always closes."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
