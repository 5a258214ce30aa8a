"""Internal: Engines and sessions: one engine per process, one session per unit of work.

SQLite (the embedded default) is opened in WAL mode with a busy timeout, and every
transaction starts with ``BEGIN IMMEDIATE`` so several worker processes can share the file
without "database is locked" upgrades mid-transaction. On SQLite the write lock taken by
``BEGIN IMMEDIATE`` is what ``SELECT … FOR UPDATE`` gives on PostgreSQL.

On PostgreSQL every connection's session runs in UTC (:func:`_session_in_utc`), whatever the
server's, the database's, the role's or the URL's ``TimeZone``: PostgreSQL converts between
``timestamptz`` and ``timestamp without time zone`` (a platform's naive columns holding UTC, as
Rails keeps them) in the session's zone, so only a UTC session makes every read and write of
either column type, and every comparison of one with a bound instant, mean UTC.

A pooled PostgreSQL connection is checked for life (an empty statement, one round trip) only
when it is checked out more than :data:`PING_AFTER_IDLE` after its previous checkout
(:func:`_ping_when_idle`), not at every checkout as ``pool_pre_ping`` does: a connection dies
(a server restart, an idle timeout in a pooler or a firewall) while it is idle, in the pool or
held unused, and a worker that runs transactions back to back would otherwise pay one extra
round trip on each. One found dead is replaced before the caller sees it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import CursorResult, Engine, Result, create_engine, event, exc
from sqlalchemy.orm import Session, sessionmaker

__all__ = [
    "dispose_engines", "engine_for", "make_engine", "make_sessionmaker", "normalise_url",
    "one_statement", "rowcount", "session_scope",
]

SQLITE_BUSY_TIMEOUT_MS = 30_000
# seconds since a pooled connection's previous checkout within which it is handed out unpinged
PING_AFTER_IDLE = 1.0
_OUT_AT = "reconcile_checked_out_at"  # record.info: its last checkout (or connect)


def rowcount(result: Result[Any]) -> int:
    """The rows an UPDATE or DELETE matched (0 where the driver cannot say): a guarded write's
    compare-and-set outcome."""
    assert isinstance(result, CursorResult)
    return int(result.rowcount or 0)


def normalise_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def make_engine(url: str, **kwargs: Any) -> Engine:
    url = normalise_url(url)
    ping_after_idle = kwargs.pop("ping_after_idle", PING_AFTER_IDLE)  # PostgreSQL's pool only
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs)
        _configure_sqlite(engine)
        return engine
    kwargs.setdefault("pool_size", 5)
    kwargs.setdefault("max_overflow", 5)
    engine = create_engine(url, **kwargs)
    if engine.dialect.name == "postgresql":
        event.listen(engine, "connect", lambda dbapi_conn, _record: _session_in_utc(dbapi_conn))
        if "pool_pre_ping" not in kwargs and ping_after_idle is not None:  # given: SQLAlchemy's
            _ping_when_idle(engine, ping_after_idle)
        event.listen(engine, "checkout",
                     lambda dbapi_conn, _record, _proxy: _session_in_utc(dbapi_conn))
    return engine


def _ping_when_idle(engine: Engine, seconds: float) -> None:
    """Ping a connection at checkout only when more than ``seconds`` passed since its previous
    checkout (or its connect): whether it lay idle in the pool or was held unused by its last
    caller, it may have died meanwhile. HikariCP skips its alive check the same way for a
    connection used within the last 500 ms.

    The ping is the dialect's own (``pool_pre_ping``'s). A ping that fails raises
    ``DisconnectionError``, on which the pool discards the connection and checks out another
    (a new one if every pooled one is dead), as SQLAlchemy's pessimistic disconnect handling
    does. A connection checked out again within ``seconds`` of its previous checkout is not
    pinged: had it died since (a server restart in that second), its first statement fails,
    the pool is invalidated and the caller's transaction rolls back, as one that died in use
    does with ``pool_pre_ping``."""
    dialect = engine.dialect

    def connected(_dbapi_conn: Any, record: Any) -> None:
        record.info[_OUT_AT] = time.monotonic()

    def checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        now = time.monotonic()
        last = record.info.get(_OUT_AT)
        record.info[_OUT_AT] = now
        if last is not None and now - last <= seconds:
            return
        try:
            dialect.do_ping(dbapi_conn)
        except dialect.loaded_dbapi.Error as err:
            raise exc.DisconnectionError(f"pooled connection failed its ping: {err}") from err

    event.listen(engine, "connect", connected)  # new: alive, whatever checks it out next
    event.listen(engine, "checkout", checkout)


def _session_in_utc(dbapi_conn: Any) -> None:
    """Put a PostgreSQL session in UTC unless the server already reports it there.

    A session-level ``SET TIME ZONE 'UTC'``, committed at once, on each new connection; and at
    each checkout the zone the server last reported (``ParameterStatus``, read locally: no round
    trip) is checked again, so a ``RESET ALL`` or a pooler that handed over a session in another
    zone is corrected before the library's next transaction. Chosen over a startup
    ``options=-c timezone=UTC``: that would replace an ``options`` the platform's URL carries,
    and PgBouncer refuses the ``options`` startup parameter or, with
    ``ignore_startup_parameters = options``, drops it silently, while it tracks a ``SET`` of
    ``TimeZone`` per client and replays it on whichever server connection serves the next
    transaction (in every pool mode)."""
    info = getattr(dbapi_conn, "info", None)
    status = getattr(info, "parameter_status", None)
    if status is not None and status("TimeZone") == "UTC":
        return
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute("SET TIME ZONE 'UTC'")
    finally:
        cursor.close()
    dbapi_conn.commit()


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


def dispose_engines(close: bool = False) -> None:
    """Forget this process's engines. By default (``worker_process_init``: engines inherited
    from a parent process) their pooled connections are left to the parent, never closed here;
    ``close=True`` closes them (before the database they point at is dropped)."""
    for engine in _ENGINES.values():
        engine.dispose(close=close)
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


@contextmanager
def one_statement(factory: sessionmaker[Session]) -> Iterator[Session]:
    """``factory.begin()`` for a transaction of exactly ONE statement: on PostgreSQL its
    connection runs in autocommit, so the statement commits itself and the transaction costs
    one round trip instead of three (no ``BEGIN``, no ``COMMIT``); a statement that raises has
    written nothing, as before. It runs at the server's default isolation level (READ
    COMMITTED unless the database sets another), not an isolation level set on the engine.

    Only for a sessionmaker bound to an :class:`~sqlalchemy.Engine`: SQLAlchemy puts the
    connection back in the engine's isolation level when it returns to the pool, so the next
    transaction on it is an ordinary one (``tests/integration/test_one_statement.py``). A
    sessionmaker bound to a ``Connection`` (whose connection never returns to a pool, and may be
    inside the caller's transaction) and SQLite get an ordinary transaction.

    In autocommit the block must leave nothing for the session to write: it runs without
    autoflush, and raises, before anything is flushed, when changes are left (a flush would
    commit each of its statements on its own)."""
    with factory.begin() as session:
        bind = session.get_bind()
        autocommit = isinstance(bind, Engine) and bind.dialect.name == "postgresql"
        if not autocommit:
            yield session
            return
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        with session.no_autoflush:
            yield session
        if session.new or session.dirty or session.deleted:
            raise RuntimeError("a one-statement transaction left changes for the session to "
                               "write (each would commit on its own): nothing was flushed")


from ..core.facade import names_moved as _names_moved  # noqa: E402

_names_moved(__name__)
