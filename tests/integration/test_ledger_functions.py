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
from reconcile.db.session import dispose_engines, make_engine, make_sessionmaker
from tests.conftest import PgDatabases

NAMES = (_pg.RESERVE_FN, _pg.COMMIT_FN, _pg.REFUND_FN)
ROOT = Path(__file__).resolve().parents[2]


def _psql(url: str) -> psycopg.Connection:
    return psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)


def _check(url: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--database-url", url, "db", "check"])
    return result.exit_code, result.stdout + result.stderr


def _below_the_functions() -> str:
    """The revision before the FIRST one that installs functions (none below it)."""
    from alembic.script import ScriptDirectory

    from reconcile.migrations import LOCATION

    below = None
    for script in ScriptDirectory(str(LOCATION)).walk_revisions():  # the head first
        if getattr(script.module, "FUNCTIONS", None) is not None:
            assert isinstance(script.down_revision, str)
            below = script.down_revision
    assert below is not None, "no revision installs functions"
    return below


def _below_the_code() -> tuple[str, dict[str, tuple[str, str]]]:
    """The revision before the one that installs the functions the code builds, and the
    functions installed there (an earlier revision's)."""
    from alembic.script import ScriptDirectory

    from reconcile.migrations import LOCATION

    scripts = ScriptDirectory(str(LOCATION))
    for script in scripts.walk_revisions():
        if getattr(script.module, "FUNCTIONS", None) == FUNCTIONS:
            assert isinstance(script.down_revision, str)
            older = {}
            for earlier in scripts.iterate_revisions(script.down_revision, "base"):
                if getattr(earlier.module, "FUNCTIONS", None) is not None:
                    older = dict(earlier.module.FUNCTIONS)
                    break
            return script.down_revision, older
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


def test_downgrade_below_the_codes_functions_puts_the_earlier_ones_back(migrated: str) -> None:
    """One revision below the functions the code builds, the database holds the earlier
    revision's (a deploy rolled back runs the code of that revision); `db check` names each one
    that differs from the code's, and the upgrade replaces them."""
    below, older = _below_the_code()
    assert older, "no earlier revision installs functions"
    downgrade(migrated, below)
    with _psql(migrated) as conn:
        assert dict(conn.execute("SELECT proname, prosrc FROM pg_proc WHERE proname = ANY(%s)",
                                 (list(NAMES),)).fetchall()) == {
            name: body for name, (_, body) in older.items()}
    changed = [name for name in NAMES if older[name] != FUNCTIONS[name]]
    assert changed, "the newest revision changes no function"
    code, out = _check(migrated)
    assert code == 1, out
    for name in changed:
        assert f"BREAKS   {name}()" in out, out
    upgrade(migrated)
    assert _check(migrated)[0] == 0


def _reserve_plans(url: str, user: uuid.UUID) -> list[str]:
    """The plans PostgreSQL ran for one reserve (auto_explain, statements inside the function
    included), as the server sent them to this session."""
    from sqlalchemy import text

    engine = make_engine(url, pool_size=1, max_overflow=0)
    notes: list[str] = []
    try:
        with make_sessionmaker(engine).begin() as s:
            raw = s.connection().connection.dbapi_connection
            raw.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
            s.execute(text("LOAD 'auto_explain'"))
            for setting in ("auto_explain.log_min_duration = 0",
                            "auto_explain.log_nested_statements = on",
                            "auto_explain.log_analyze = on", "client_min_messages = log"):
                s.execute(text(f"SET LOCAL {setting}"))
            credits.reserve(s, user, uuid.uuid4(), 10)
    finally:
        engine.dispose()
    return notes


def test_a_reserve_writes_the_lots_it_takes_through_the_primary_key(
        pg_databases: PgDatabases) -> None:
    """A user with thousands of open lots (each refund adds one), the table analysed: the
    reserve's update of the lots its walk took probes the primary key, PostgreSQL's own plan
    says (auto_explain); it never reads the whole lots table. Revision 0029's statement was
    planned as a hash join over a sequential scan of every lot here, and each reserve slowed
    with each refund."""
    from sqlalchemy import text

    url = pg_databases.create("rtplan")
    upgrade(url)
    engine = make_engine(url)
    user = uuid.uuid4()
    try:
        with make_sessionmaker(engine).begin() as s:
            credits.grant(s, user, "sub", 10**9, f"g-{user}")
        with engine.begin() as conn:  # 5,000 refunds' lots and what they gave back
            conn.execute(text(
                "INSERT INTO reconcile_credit_lots (user_id, pool, kind, source_txn_id, amount, "
                "remaining_amount, created_at) SELECT :u, 'sub', 'REFUND', 'plan-' || g, 10, 10, "
                "now() FROM generate_series(1, 5000) g"), {"u": user})
            conn.execute(text("UPDATE reconcile_credit_balances SET sub = sub + 50000 "
                              "WHERE user_id = :u"), {"u": user})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE reconcile_credit_lots"))
    finally:
        engine.dispose()
    plans = _reserve_plans(url, user)
    lot_update = [p for p in plans if "Update on reconcile_credit_lots" in p]
    assert len(lot_update) == 1, plans
    assert "Seq Scan on reconcile_credit_lots" not in lot_update[0], lot_update[0]
    assert re.search(r"Index (Only )?Scan using \w+ on reconcile_credit_lots l", lot_update[0]), \
        lot_update[0]


def test_a_database_upgraded_ahead_of_the_code_lets_it_start(pg_databases: PgDatabases) -> None:
    """A rolling upgrade: the migrations of a later release ran (the database is at a revision
    this code does not know) and that revision replaced a function's body. `db check` reports
    it (DIFFERS, not BREAKS: nothing that refuses a start), a runtime starts and `db repair`
    leaves it; a function that is missing still breaks, and
    a replaced body at this code's own head still breaks."""
    url = pg_databases.create("rtahead")
    upgrade(url)
    reserve_args, reserve_body = FUNCTIONS[_pg.RESERVE_FN]
    newer_body = reserve_body.replace("BEGIN\n", "BEGIN\n-- a later revision's body\n", 1)
    assert newer_body != reserve_body
    with _psql(url) as conn:
        conn.execute(functions.function_ddl(_pg.RESERVE_FN, reserve_args, newer_body))
    code, out = _check(url)  # at this code's head: a body it does not define breaks
    assert code == 1 and "BREAKS   reconcile_ledger_reserve(): not the body" in out, out
    with _psql(url) as conn:
        conn.execute("UPDATE reconcile_alembic_version SET version_num = '9999'")
    _, out = _check(url)  # mismatches all the same (the version too), none that breaks
    assert ("DIFFERS  reconcile_ledger_reserve(): as revision 9999 defines it, a revision "
            "this code does not know") in out, out
    assert "BREAKS" not in out, out
    Runtime.from_settings(Settings(database_url=url))  # starts
    repaired = CliRunner().invoke(main, ["--database-url", url, "db", "repair"])
    assert repaired.exit_code == 0 and "reconcile_ledger_reserve" not in repaired.stdout, \
        repaired.output  # the later revision's body is never replaced by this code's
    with _psql(url) as conn:
        assert conn.execute("SELECT prosrc FROM pg_proc WHERE proname = %s",
                            (_pg.RESERVE_FN,)).fetchone() == (newer_body,)
    with _psql(url) as conn:
        conn.execute(functions.drop_ddl(_pg.COMMIT_FN, FUNCTIONS[_pg.COMMIT_FN][0]))
    code, out = _check(url)
    assert code == 1 and "BREAKS   reconcile_ledger_commit(): missing" in out, out
    dispose_engines(close=True)  # a process checks its database once per engine
    with pytest.raises(SchemaMismatch, match="reconcile_ledger_commit"):
        Runtime.from_settings(Settings(database_url=url))
    dispose_engines(close=True)
    repaired = CliRunner().invoke(main, ["--database-url", url, "db", "repair"])
    assert repaired.exit_code == 0 and "reconcile_ledger" not in repaired.stdout, \
        repaired.output  # not even a missing one: the later release's body is its to install


@pytest.mark.parametrize("versions", [[""], ["base"], ["0033 "], ["003"], ["0001"],
                                      ["9999", "9998"], ["0033", "9999"]],
                         ids=["blank", "base", "space", "prefix", "older", "two", "head_and_more"])
def test_no_odd_version_row_passes_for_a_later_release(pg_databases: PgDatabases,
                                                       versions: list[str]) -> None:
    """Only one row holding a revision number above this code's head is a later release's:
    with anything else in the version table, a function replaced by hand still breaks."""
    url = pg_databases.create("rtodd")
    upgrade(url)
    reserve_args, reserve_body = FUNCTIONS[_pg.RESERVE_FN]
    with _psql(url) as conn:
        conn.execute(functions.function_ddl(_pg.RESERVE_FN, reserve_args,
                                            reserve_body.replace("BEGIN\n", "BEGIN\n-- x\n", 1)))
        conn.execute("DELETE FROM reconcile_alembic_version")
        for version in versions:
            conn.execute("INSERT INTO reconcile_alembic_version VALUES (%s)", (version,))
    code, out = _check(url)
    assert code == 1 and "BREAKS   reconcile_ledger_reserve(): not the body" in out, out
