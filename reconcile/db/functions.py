"""Internal: the library's PostgreSQL functions (the ledger's reserve, commit and refund, one
round trip each): their DDL, the definitions the newest revision declaring them installs, and
which of them a database lacks or holds with another body.

A revision that installs functions declares them as ``FUNCTIONS = {name: (arguments, body)}``
(frozen, as every revision is) and runs :func:`reconcile.db.migrate.create_functions`; the
newest such revision's set is the one the library expects (:func:`declared`). The table
contract reports a function missing or different (``reconcile db check``: a start-up refuses,
rather than run the ledger on other statements than its own), and ``reconcile db repair`` puts
the declared ones back when the migrations are at head.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from sqlalchemy import Connection, text

Functions = Mapping[str, tuple[str, str]]  # name → (arguments, body)
# what :func:`differing` says of a function whose body is not the declared one
OTHER_BODY = "not the body the library's revisions define (replaced by hand, or older)"


def function_ddl(name: str, arguments: str, body: str) -> str:
    """``CREATE OR REPLACE FUNCTION`` of one function: PL/pgSQL, VOLATILE (each statement in
    it takes a fresh snapshot under READ COMMITTED), ``body`` its source exactly."""
    return (f"CREATE OR REPLACE FUNCTION {name}({arguments})\n"
            f"LANGUAGE plpgsql VOLATILE AS $body${body}$body$")


def install(conn: Connection, name: str, arguments: str, body: str) -> None:
    """Run :func:`function_ddl` on ``conn`` (as a ``text()``, as a revision's ``op.execute``
    does: a body's ``%TYPE`` is no driver placeholder)."""
    conn.execute(text(function_ddl(name, arguments, body)))


def drop_ddl(name: str, arguments: str) -> str:
    return f"DROP FUNCTION IF EXISTS {name}({arguments})"


def declared() -> dict[str, tuple[str, str]]:
    """The functions as the newest revision declaring ``FUNCTIONS`` installs them (none: no
    revision does)."""
    return dict(_declared())


@cache
def _declared() -> tuple[tuple[str, tuple[str, str]], ...]:  # the revisions ship with the code
    from alembic.script import ScriptDirectory

    from ..migrations import LOCATION

    for script in ScriptDirectory(str(LOCATION)).walk_revisions():  # the head first
        functions = getattr(script.module, "FUNCTIONS", None)
        if functions is not None:
            return tuple(functions.items())
    return ()


def installed(conn: Connection, names: list[str]) -> dict[str, list[str]]:
    """The bodies of the functions called ``names`` in the current schema (PostgreSQL)."""
    out: dict[str, list[str]] = {}
    for name, body in conn.execute(text(
            "SELECT p.proname, p.prosrc FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND p.proname = ANY(:names) "
            "ORDER BY p.oid"), {"names": names}):
        out.setdefault(name, []).append(body)
    return out


def differing(conn: Connection, functions: Functions | None = None) -> dict[str, str]:
    """``name → what is wrong`` for each declared function the database lacks or holds with
    another body (or more than once: an overload the library did not create). PostgreSQL only:
    SQLite has no functions and the ledger's Core path there needs none."""
    if conn.dialect.name != "postgresql":
        return {}
    functions = declared() if functions is None else functions
    live = installed(conn, list(functions))
    out: dict[str, str] = {}
    for name, (_, body) in functions.items():
        bodies = live.get(name, [])
        if not bodies:
            out[name] = "missing (a function of the library's)"
        elif len(bodies) > 1:
            out[name] = f"defined {len(bodies)} times (overloads the library did not create)"
        elif bodies[0] != body:
            out[name] = OTHER_BODY
    return out
