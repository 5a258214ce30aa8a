"""The ledger's PL/pgSQL functions (reserve, commit and refund in one round trip each): the
newest revision installs exactly what the code builds from its statements today, so the two
cannot drift (a changed statement fails here until a new revision replaces the functions); a
database without them, or with other bodies, breaks the table contract (a start-up refuses, and
no operation falls back to other statements), and ``reconcile db repair`` / ``db upgrade`` put
them back."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy.exc import ProgrammingError

from reconcile import Runtime, Settings, credits
from reconcile.cli import main
from reconcile.credits import _pg
from reconcile.credits._pg_functions import FUNCTIONS
from reconcile.db import functions
from reconcile.db.contract import SchemaMismatch
from reconcile.db.migrate import downgrade, upgrade
from reconcile.db.session import make_engine, make_sessionmaker
from tests.conftest import PgDatabases

NAMES = (_pg.RESERVE_FN, _pg.COMMIT_FN, _pg.REFUND_FN)
ROOT = Path(__file__).resolve().parents[2]


def _psql(url: str) -> psycopg.Connection:
    return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)


def _check(url: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--database-url", url, "db", "check"])
    return result.exit_code, result.stdout + result.stderr


def _below_the_functions() -> str:
    """The revision before the one that installs the functions the code builds."""
    from alembic.script import ScriptDirectory

    from reconcile.migrations import LOCATION

    for script in ScriptDirectory(str(LOCATION)).walk_revisions():
        if getattr(script.module, "FUNCTIONS", None) == FUNCTIONS:
            assert isinstance(script.down_revision, str)
            return script.down_revision
    raise AssertionError("no revision installs the functions the code builds")


@pytest.fixture(scope="module")
def migrated(pg_databases: PgDatabases) -> Iterator[str]:
    url = pg_databases.create("rtfn")
    upgrade(url)
    yield url


def test_the_newest_revision_defines_what_the_code_builds() -> None:
    """The revision's frozen copy is the code's: a statement changed in reconcile/credits/_pg.py
    without a new revision replacing the functions fails here."""
    assert set(FUNCTIONS) == set(NAMES)
    assert functions.declared() == FUNCTIONS


def test_each_variable_of_a_body_is_declared() -> None:
    """A statement's ``%(name)s`` becomes ``p_name``: each one a body uses is an argument of its
    function (an undeclared one would fail only when the statement first runs)."""
    params = {_pg.RESERVE_FN: _pg.RESERVE_PARAMS, _pg.COMMIT_FN: _pg.COMMIT_PARAMS,
              _pg.REFUND_FN: _pg.REFUND_PARAMS}
    for name, (arguments, body) in FUNCTIONS.items():
        used = set(re.findall(r"\bp_\w+", body))
        assert used == {f"p_{p}" for p, _ in params[name]}, name
        assert all(f"p_{p} {t}" in arguments for p, t in params[name]), name
        assert "%" not in body, name


def test_the_offline_sql_holds_each_definition_verbatim(pg_url: str) -> None:
    """`alembic upgrade --sql` (the script a DBA may run by hand, and what squawk reads)
    prints each function's CREATE OR REPLACE exactly as the code builds it (no character of a
    body escaped or doubled)."""
    sql = subprocess.run([sys.executable, "-m", "alembic", "-c", str(ROOT / "alembic.ini"), "-x",
                          f"url={pg_url}", "upgrade", "0001:head", "--sql"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    for name, (arguments, body) in FUNCTIONS.items():
        assert functions.function_ddl(name, arguments, body) + ";" in sql, name


def test_the_installed_functions_are_what_the_code_builds(pg_url: str) -> None:
    """In the migrated test database each function's source is the code's body exactly,
    PL/pgSQL and VOLATILE (a fresh snapshot per statement), defined once."""
    with _psql(pg_url) as conn:
        rows = conn.execute(
            "SELECT p.proname, p.prosrc, p.provolatile, l.lanname FROM pg_proc p "
            "JOIN pg_language l ON l.oid = p.prolang WHERE p.proname = ANY(%s)",
            (list(NAMES),)).fetchall()
    assert sorted(r[0] for r in rows) == sorted(NAMES)
    for name, source, volatile, language in rows:
        assert source == FUNCTIONS[name][1], name
        assert (volatile, language) == ("v", "plpgsql"), name
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert functions.differing(conn) == {}
    finally:
        engine.dispose()


def test_a_missing_or_replaced_function_breaks_the_contract_and_repair_restores_it(
        migrated: str) -> None:
    """At head, one function dropped and another replaced by hand: `db check` names both
    (BREAKS, fix `db repair`), a runtime refuses to start, the ledger's reserve fails rather
    than run other statements; `db repair` installs the revision's definitions again."""
    arguments, _ = FUNCTIONS[_pg.REFUND_FN]
    with _psql(migrated) as conn:
        conn.execute(functions.drop_ddl(_pg.COMMIT_FN, FUNCTIONS[_pg.COMMIT_FN][0]))
        conn.execute(functions.function_ddl(_pg.REFUND_FN, arguments, "\nBEGIN\nRETURN;\nEND;\n"))
    code, out = _check(migrated)
    assert code == 1, out
    assert ("BREAKS   reconcile_ledger_commit(): missing (a function of the library's)\n"
            "    fix: reconcile db repair") in out
    assert "BREAKS   reconcile_ledger_refund(): not the body the library's revisions define" in out
    assert "reconcile_ledger_reserve()" not in out
    with pytest.raises(SchemaMismatch, match="reconcile_ledger_commit"):
        Runtime.from_settings(Settings(database_url=migrated))
    engine = make_engine(migrated)
    sessions = make_sessionmaker(engine)
    user, job = uuid.uuid4(), uuid.uuid4()
    try:
        with sessions.begin() as s:
            credits.grant(s, user, "sub", 100, f"g-{user}")
            credits.reserve(s, user, job, 40)
        with pytest.raises(ProgrammingError, match="reconcile_ledger_commit"), sessions.begin() as s:
            credits.commit(s, job)  # no fallback: the Core path never runs in its place
        repaired = CliRunner().invoke(main, ["--database-url", migrated, "db", "repair"])
        assert repaired.exit_code == 0, repaired.output
        assert repaired.stdout.splitlines() == [
            "CREATE OR REPLACE FUNCTION reconcile_ledger_commit",
            "CREATE OR REPLACE FUNCTION reconcile_ledger_refund", "repaired: 2 statement(s)"]
        assert _check(migrated)[0] == 0
        with sessions.begin() as s:
            assert credits.commit(s, job, 30) is True
        with sessions() as s:
            assert credits.audit(s) == []
    finally:
        engine.dispose()


def test_downgrade_drops_them_and_upgrade_installs_them(migrated: str) -> None:
    """Below the revision the functions are gone and `db check` says to upgrade; the upgrade
    installs them as the code builds them."""
    downgrade(migrated, _below_the_functions())
    with _psql(migrated) as conn:
        assert conn.execute("SELECT count(*) FROM pg_proc WHERE proname = ANY(%s)",
                            (list(NAMES),)).fetchone() == (0,)
    code, out = _check(migrated)
    assert code == 1, out
    for name in NAMES:
        assert (f"BREAKS   {name}(): missing (a function of the library's)\n"
                "    fix: reconcile db upgrade") in out
    upgrade(migrated)
    assert _check(migrated)[0] == 0
    with _psql(migrated) as conn:
        assert dict(conn.execute("SELECT proname, prosrc FROM pg_proc WHERE proname = ANY(%s)",
                                 (list(NAMES),)).fetchall()) == {
            name: body for name, (_, body) in FUNCTIONS.items()}
