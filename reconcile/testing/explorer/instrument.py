"""Internal: the explorer's step instrumentation (see :mod:`reconcile.testing.explorer`).

Which SQL statements are boundaries (savepoints and outbox-only statements are not; a statement
that changed or locked a row makes its transaction's COMMIT one), the statement fingerprint a
trace shows, and the writer engines' connection helpers (fast deadlock detection, the backend pid
a lock wait is looked up by).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

# ----------------------------------------------------------------------------- statements

_SKIP = re.compile(r"^\s*(SAVEPOINT|RELEASE SAVEPOINT|ROLLBACK TO SAVEPOINT)\b", re.I)
_WRITE = re.compile(r"^\s*(UPDATE|INSERT|DELETE)\b|\bFOR UPDATE\b|\bFOR NO KEY UPDATE\b", re.I)
_TABLES = re.compile(r"\b(?:FROM|INTO|(?<!FOR )UPDATE|JOIN)\s+\"?([a-z_][a-z0-9_]*)\"?", re.I)


def fingerprint(statement: str) -> str:
    """A short, parameter-free name for a statement: ``SELECT jobs FOR UPDATE``."""
    words = statement.split()
    verb = words[0].upper() if words else "?"
    tables = sorted(dict.fromkeys(t.lower() for t in _TABLES.findall(statement)))
    lock = " FOR UPDATE" if re.search(r"\bFOR UPDATE\b", statement, re.I) else ""
    return f"{verb} {','.join(tables)}{lock}".strip()


def _outbox_only(statement: str, outbox: str) -> bool:
    tables = {t.lower() for t in _TABLES.findall(statement)}
    return bool(tables) and tables <= {outbox}



def _fast_deadlocks(dbapi_conn: Any, _record: Any) -> None:
    """Deadlocks between the two writers are found by PostgreSQL in 50 ms, not 1 s."""
    with contextlib.suppress(Exception):
        with dbapi_conn.cursor() as cur:
            cur.execute("SET deadlock_timeout = '50ms'")
        dbapi_conn.commit()


def _backend_pid(conn: Any) -> int | None:
    info = conn.info
    pid = info.get("explorer_pid")
    if pid is None:
        with contextlib.suppress(Exception):
            pid = info["explorer_pid"] = conn.connection.dbapi_connection.info.backend_pid
    return None if pid is None else int(pid)


def _plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)
