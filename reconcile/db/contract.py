"""Internal: The table contract: what the library needs of the platform's tables, and a check of a live
database against it (``reconcile db check``; workers, beat and every process building a
:class:`~reconcile.runtime.Runtime` run the same check at start-up).

The platform owns ``jobs``, ``usage_logs`` and ``workflow_executions``; the library reads and
writes the columns :mod:`reconcile.db.models` maps on them. A column is either the platform's
(:data:`PLATFORM_COLUMNS`: the library's migrations never add it to an existing table, so the
platform's table must have it) or added by ``reconcile db upgrade`` where it is missing
(``ADD COLUMN IF NOT EXISTS``, nullable or with a constant default). Each column accepts the
types of its family (:data:`FAMILIES`), as loose as the library's reads and writes allow:

* ``usage_logs.id`` is a uuid or an integer. Where the column has a default (an identity, a
  serial, ``gen_random_uuid()``, SQLite's ``INTEGER PRIMARY KEY``) the database assigns the id;
  a uuid column without one gets a uuid from the library (:func:`usage_log_ids_assigned`).
* ``jobs.id`` and every user id stay uuids (the ledger keys balances, lots, transactions, events
  and idempotency keys by them).
* timestamps are ``timestamptz`` or naive ``timestamp`` (read and written as UTC).

On PostgreSQL the contract also holds the ledger's functions (reserve, commit and refund in
one round trip each): each must exist with the body the newest revision defining them installs
(:mod:`.functions`), or the ledger would fail, or run other statements than the library's.

:func:`check` compares a database with the contract and returns :class:`Finding` s, each with its
fix: ``breaks`` (a request would fail: a start-up refuses), ``differs`` (not what the library
expects, nothing fails yet: the check exits 1) or ``note`` (accepted as it is).
"""

from __future__ import annotations

import logging
import os
import re
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Connection,
    Engine,
    Integer,
    Numeric,
    Text,
    Uuid,
    exc,
    text,
)
from sqlalchemy.types import JSON, TypeEngine

from .functions import OTHER_BODY, differing
from .models import Base, UsageLogId
from .types import UTCDateTime

__all__ = [
    "BREAKS", "DIFFERS", "FAMILIES", "LIBRARY_TABLES", "NOTE", "PLATFORM_COLUMNS", "PLATFORM_TABLES",
    "Finding", "SchemaMismatch", "at_head", "check", "contract_markdown", "newer_revision", "require", "usage_log_ids_assigned",
]

log = logging.getLogger("reconcile.contract")

BREAKS, DIFFERS, NOTE = "breaks", "differs", "note"
PLATFORM_TABLES = ("jobs", "usage_logs", "workflow_executions")
# the columns an existing platform table must already have (the library never adds them); every
# other mapped column is added by `reconcile db upgrade` where it is missing
PLATFORM_COLUMNS: dict[str, tuple[str, ...]] = {
    "jobs": ("id", "user_id", "job_type", "status", "input_data", "output_data", "error_message",
             "provider", "created_at", "started_at", "completed_at"),
    "usage_logs": ("id", "job_id", "user_id", "status", "credits", "metadata"),
    "workflow_executions": ("id", "status"),
}
# tables the library inserts rows into: a column of the platform's it does not set must be
# nullable or have a default
INSERTED_INTO = ("jobs", "usage_logs")
# nullable in the mapping (a platform's rows may hold NULL) but never NULL when the library writes
# the row: a NOT NULL column is fine
# (workflow_executions: the library never inserts a row, and writes failed_nodes only as a list)
ALWAYS_SET = frozenset({"jobs.input_data", "usage_logs.job_id", "usage_logs.metadata",
                        "workflow_executions.failed_nodes"})
# nullable in the mapping, and never written NULL by the library: not in the job's insert, or
# left out of it when NOT NULL with a default and the submit has no value
# (:func:`reconcile.jobstore.insert_job_with_event`, :func:`defaulted_not_null`); later written
# only with a value (a job's start, its outputs, its provider, its completion). A NOT NULL column
# with a default takes the default (``should_watermark``: the platform's default, not the
# library's "watermark when unset", decides for a submit that gives none); without one, the insert
# fails. Every other nullable column may be written NULL (the completion clears
# ``error_message``; a job outside a workflow has no ``workflow_execution_id``, and NULL is how
# the library knows it): NOT NULL there breaks a write, default or not.
FILLED_BY_DEFAULT = frozenset({
    "jobs.output_data", "jobs.provider", "jobs.started_at", "jobs.completed_at",
    "jobs.should_watermark", "jobs.is_public", "jobs.poll_resumes", "jobs.storing_until",
    "jobs.storing_count"})
LIBRARY_TABLES = tuple(sorted(name for name in Base.metadata.tables if name not in PLATFORM_TABLES))
UUID_ONLY = "the library's ids are uuids; an integer or text id is not supported yet"
# the fix of a library column or table that is gone while its migrations are at head
_REPAIR_FIX = ("reconcile db repair (the library's migrations are at head, so `db upgrade` adds "
              "nothing: the table was rebuilt or altered after them, as Django's SQLite "
              "AlterField rebuilds it; repair adds the library's columns, indexes and tables "
              "back, without the values a rebuild dropped)")

_FUNCTION_FIX = ("reconcile db repair (the library's migrations are at head: it installs the "
                 "ledger's functions as its newest revision defining them has them)")


@dataclass(frozen=True)
class Family:
    """The types a column accepts: PostgreSQL ``format_type`` names (``notes``: accepted with a
    remark) and SQLite type affinities."""

    name: str
    pg: frozenset[str]
    sqlite: frozenset[str]
    ddl: str  # PostgreSQL type a fix adds or converts to
    notes: tuple[tuple[str, str], ...] = ()

    def note_for(self, pg_type: str) -> str | None:
        return next((note for prefix, note in self.notes if pg_type.startswith(prefix)), None)


_TEXT, _NUM, _INT, _REAL = "text", "numeric", "integer", "real"
NAIVE_UTC = ("timestamp without time zone",
             "naive timestamp: accepted, read and written as UTC")
FAMILIES: dict[str, Family] = {
    "uuid": Family("uuid", frozenset({"uuid"}), frozenset({_TEXT}), "uuid"),
    "usage log id": Family("uuid, or an integer with a default", frozenset({"uuid"}),
                           frozenset({_TEXT, _INT}), "uuid"),
    "text": Family("text", frozenset({"text", "character varying"}), frozenset({_TEXT}), "text",
                   (("character varying(", "length-limited: a longer value fails its write"),)),
    "jsonb": Family("jsonb", frozenset({"jsonb"}), frozenset({_TEXT, _NUM}), "jsonb"),
    "timestamp": Family("timestamptz", frozenset({"timestamp with time zone"}),
                        frozenset({_TEXT, _NUM, _INT, _REAL}), "timestamptz", (NAIVE_UTC,)),
    "integer": Family("integer", frozenset({"integer", "bigint"}), frozenset({_INT}), "integer",
                      (("smallint", "values above 32,767 fail their write"),)),
    "bigint": Family("bigint", frozenset({"bigint"}), frozenset({_INT}), "bigint",
                     (("integer", "credits above 2,147,483,647 fail their write"),)),
    "boolean": Family("boolean", frozenset({"boolean"}), frozenset({_NUM, _INT}), "boolean"),
    "numeric": Family("numeric", frozenset({"numeric", "double precision", "real", "integer",
                                            "bigint"}),
                      frozenset({_NUM, _INT, _REAL}), "numeric(12,6)"),
}
_PG_PREFIXES = {"numeric(": "numeric", "character varying(": "character varying",
                "timestamp(": None}


def family_of(type_: TypeEngine[Any]) -> str:
    """The family of a mapped column's type (:data:`FAMILIES`)."""
    checks: tuple[tuple[type, str], ...] = (
        (UsageLogId, "usage log id"), (UTCDateTime, "timestamp"), (Uuid, "uuid"),
        (BigInteger, "bigint"), (Integer, "integer"), (Boolean, "boolean"),
        (Numeric, "numeric"), (JSON, "jsonb"), (Text, "text"))
    for cls, name in checks:
        if isinstance(type_, cls):
            return name
    raise TypeError(f"no contract family for {type_!r}")  # pragma: no cover - models changed


@dataclass(frozen=True)
class Column:
    table: str
    name: str
    family: str
    platform: bool  # the platform's table must have it; else `reconcile db upgrade` adds it
    nullable: bool
    longest: int | None = None  # text: the longest value the library writes (models._longest)


def columns(table: str) -> tuple[Column, ...]:
    """The contract of one platform table, from its mapping."""
    mapped = Base.metadata.tables[table]
    return tuple(Column(table, c.name, family_of(c.type), c.name in PLATFORM_COLUMNS[table],
                        bool(c.nullable), c.info.get("longest")) for c in mapped.columns)


@dataclass(frozen=True)
class Finding:
    where: str  # "usage_logs.id", "jobs", "reconcile_alembic_version", "reconcile_ledger_reserve()"
    found: str
    level: str  # BREAKS | DIFFERS | NOTE
    fix: str = ""

    def line(self, escape: Callable[[str], str] = str) -> str:
        """``LEVEL    where: found`` and the fix on a second line (``escape``: each part, e.g.
        for a terminal: a column name is the platform's text)."""
        fix = f"\n    fix: {escape(self.fix)}" if self.fix else ""
        return f"{self.level.upper():8} {escape(self.where)}: {escape(self.found)}{fix}"


class SchemaMismatch(RuntimeError):
    """The database breaks the table contract: a request would fail (``reconcile db check``)."""

    def __init__(self, findings: Iterable[Finding]) -> None:
        self.findings = tuple(findings)
        lines = "; ".join(f"{f.where}: {f.found}" for f in self.findings)
        super().__init__(f"the database does not fit the library's table contract ({lines}); "
                         "run `reconcile db check` for every mismatch and its fix")


# ----------------------------------------------------------------------------- reading a database


@dataclass(frozen=True)
class _Live:
    type: str  # PostgreSQL format_type, or the SQLite affinity
    declared: str  # as written (SQLite), = type on PostgreSQL
    nullable: bool
    default: bool  # a default, an identity, or SQLite's rowid alias
    primary: bool


def _affinity(declared: str) -> str:
    """SQLite's type affinity of a declared type (its documented rules, in order)."""
    t = declared.upper()
    if "INT" in t:
        return _INT
    if any(k in t for k in ("CHAR", "CLOB", "TEXT")):
        return _TEXT
    if not t or "BLOB" in t:
        return "blob"
    if any(k in t for k in ("REAL", "FLOA", "DOUB")):
        return _REAL
    return _NUM


def _pg_columns(conn: Connection, table: str) -> dict[str, _Live] | None:
    # a domain is checked as its base type (what its values are stored as), named as declared
    rows = conn.execute(text(
        "SELECT a.attname, format_type(CASE WHEN t.typtype = 'd' THEN t.typbasetype "
        "ELSE a.atttypid END, CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END), "
        "NOT a.attnotnull, "
        "a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '', "
        "COALESCE(a.attnum = ANY(i.indkey), false), format_type(a.atttypid, a.atttypmod) "
        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_type t ON t.oid = a.atttypid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_index i ON i.indrelid = c.oid AND i.indisprimary "
        "WHERE c.relname = :t AND n.nspname = current_schema() AND c.relkind IN ('r', 'p') "
        "AND a.attnum > 0 AND NOT a.attisdropped"), {"t": table}).all()
    if not rows:
        exists = conn.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": table}).scalar()
        if not exists:
            return None
    return {r[0]: _Live(r[1], r[1] if r[5] == r[1] else f"{r[5]} ({r[1]})", bool(r[2]),
                        bool(r[3]), bool(r[4])) for r in rows}


def _sqlite_columns(conn: Connection, table: str) -> dict[str, _Live] | None:
    exists = conn.exec_driver_sql(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).first()
    if exists is None:
        return None
    rows = conn.exec_driver_sql(f'PRAGMA table_info("{table}")').all()
    pk = [r for r in rows if r[5]]
    out = {}
    for _cid, name, declared, notnull, default, primary in rows:
        rowid = len(pk) == 1 and bool(primary) and str(declared).upper() == "INTEGER"
        out[name] = _Live(_affinity(str(declared)), str(declared), not notnull and not primary,
                          default is not None or rowid, bool(primary))
    return out


def _live_columns(conn: Connection, table: str) -> dict[str, _Live] | None:
    if conn.dialect.name == "postgresql":
        return _pg_columns(conn, table)
    return _sqlite_columns(conn, table)


def _base_pg_type(pg_type: str) -> str:
    for prefix, base in _PG_PREFIXES.items():
        if pg_type.startswith(prefix):
            return base or pg_type.split("(")[0] + pg_type.split(")", 1)[1]
    return pg_type


# ----------------------------------------------------------------------------- the check


def _column_findings(col: Column, live: _Live | None, dialect: str) -> list[Finding]:
    where = f"{col.table}.{col.name}"
    family = FAMILIES[col.family]
    if live is None:
        if col.platform:
            return [Finding(where, "missing (a column of the platform's table the library reads)",
                            BREAKS, f"ALTER TABLE {col.table} ADD COLUMN {col.name} {family.ddl}"
                            f"{'' if col.nullable else ' NOT NULL'}")]
        return [Finding(where, "missing (the library adds it)", BREAKS,
                        "reconcile db upgrade")]
    if col.family == "usage log id":
        return _usage_log_id(where, live, dialect)
    out = _type_findings(col, where, live, dialect)
    if col.nullable and not live.nullable and not live.primary and where not in ALWAYS_SET:
        out.append(_not_null(col, where, live))
    return out


def _not_null(col: Column, where: str, live: _Live) -> Finding:
    """A NOT NULL column the mapping has nullable: see :data:`FILLED_BY_DEFAULT`."""
    fix = f"ALTER TABLE {col.table} ALTER COLUMN {col.name} DROP NOT NULL"
    if where in FILLED_BY_DEFAULT:
        if live.default:
            return Finding(where, "NOT NULL with a default: a row the library writes without a "
                                  "value takes the default", NOTE)
        return Finding(where, "NOT NULL without a default, where the library leaves it out of "
                              "a row it has no value for", BREAKS, fix + ", or SET DEFAULT <value>")
    return Finding(where, "NOT NULL, where the library may write NULL"
                          f"{' (a default does not apply to a written NULL)' if live.default else ''}",
                   BREAKS, fix)


def _type_findings(col: Column, where: str, live: _Live, dialect: str) -> list[Finding]:
    family = FAMILIES[col.family]
    if dialect == "postgresql":
        if not live.type.endswith("[]"):  # an array is no family's type
            base = _base_pg_type(live.type)
            short = _too_short(col, where, live.type)
            if short is not None:
                return [short]
            note = family.note_for(live.type) or family.note_for(base)
            if note is not None:
                return [Finding(where, f"{live.declared}: {note}", NOTE)]
            if base in family.pg:
                return []
    elif live.type in family.sqlite:
        return []
    if col.family == "uuid":
        return [Finding(where, f"{live.declared}, not uuid: {UUID_ONLY}", BREAKS,
                        f"make {where} a uuid (there is no in-place conversion of existing ids)")]
    return [Finding(where, f"{live.declared}, not {family.name}", BREAKS,
                    f"ALTER TABLE {col.table} ALTER COLUMN {col.name} TYPE {family.ddl} "
                    f"USING {col.name}::{family.ddl} (rewrites the table: plan it)")]


def _too_short(col: Column, where: str, pg_type: str) -> Finding | None:
    """A ``varchar(n)`` shorter than the longest value the library writes to the column: that
    write fails (a status, a provider's status), so a job stops where it is."""
    m = re.fullmatch(r"character varying\((\d+)\)", pg_type)
    if m is None or col.longest is None or int(m.group(1)) >= col.longest:
        return None
    return Finding(where, f"{pg_type}: the library writes values of up to {col.longest} "
                          "characters here, and a longer value fails its write", BREAKS,
                   f"ALTER TABLE {col.table} ALTER COLUMN {col.name} TYPE varchar({col.longest}) "
                   "(or text; widening a varchar rewrites nothing)")


def _usage_log_id(where: str, live: _Live, dialect: str) -> list[Finding]:
    integer = (live.type in ("integer", "bigint", "smallint") if dialect == "postgresql"
               else live.type == _INT)
    uuid_ = live.type == "uuid" if dialect == "postgresql" else live.type == _TEXT
    if integer and live.default:
        return [Finding(where, f"{live.declared} with a default: the database assigns it", NOTE)]
    if uuid_:
        return []
    if integer:
        return [Finding(where, f"{live.declared} without a default: nothing assigns the id of a "
                               "reservation's usage log", BREAKS,
                        "ALTER TABLE usage_logs ALTER COLUMN id ADD GENERATED BY DEFAULT AS "
                        "IDENTITY (then SELECT setval(pg_get_serial_sequence('usage_logs', "
                        "'id'), max(id)) FROM usage_logs)")]
    return [Finding(where, f"{live.declared}: neither a uuid nor an integer", BREAKS,
                    "make usage_logs.id a uuid, or an integer identity")]


def _table_findings(conn: Connection, table: str) -> list[Finding]:
    live = _live_columns(conn, table)
    if live is None:
        return [Finding(table, "missing", BREAKS, "reconcile db upgrade (creates it)")]
    contract = columns(table)
    out: list[Finding] = []
    for col in contract:
        out += _column_findings(col, live.get(col.name), conn.dialect.name)
    if table in INSERTED_INTO:
        known = {c.name for c in contract}
        for name, found in live.items():
            if name not in known and not found.nullable and not found.default:
                out.append(Finding(f"{table}.{name}", "NOT NULL without a default: the library's "
                                   "inserts do not set it", BREAKS,
                                   f"ALTER TABLE {table} ALTER COLUMN {name} SET DEFAULT <value>, "
                                   f"or DROP NOT NULL"))
    return out


def _version_findings(conn: Connection, head: str | None) -> list[Finding]:
    where = "reconcile_alembic_version"
    if _live_columns(conn, where) is None:
        return [Finding(where, "missing: the library's migrations never ran", BREAKS,
                        "reconcile db upgrade")]
    current = conn.execute(text(f"SELECT version_num FROM {where}")).scalars().all()
    if head is not None and current != [head]:
        return [Finding(where, f"at {', '.join(current) or 'nothing'}, not at head {head}",
                        DIFFERS, "reconcile db upgrade")]
    return []


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    from ..migrations import LOCATION

    return str(ScriptDirectory(str(LOCATION)).get_current_head())


def at_head(url: str) -> bool:
    """Whether the library's migrations on ``url`` are at head."""
    from .session import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return not _version_findings(conn, head_revision())
    finally:
        engine.dispose()


def check(bind: Engine | Connection) -> list[Finding]:
    """Every way the database at ``bind`` differs from the contract (see the module)."""
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            return check(conn)
    head = head_revision()
    out = _version_findings(bind, head)
    at_head_now = not out
    for table in PLATFORM_TABLES:
        out += _table_findings(bind, table)
    for table in LIBRARY_TABLES:
        if _live_columns(bind, table) is None:
            out.append(Finding(table, "missing (a table of the library's)", BREAKS,
                               "reconcile db upgrade"))
    if at_head_now:  # `db upgrade` has nothing left to run: what is gone was removed after it
        out = [replace(f, fix=_REPAIR_FIX) if f.fix == "reconcile db upgrade" else f for f in out]
    functions = differing(bind)  # the ledger's (PostgreSQL): never run others
    # read only when a body differs: the usual start-up finds none
    newer = newer_revision(bind, head) if OTHER_BODY in functions.values() else None
    for name, found in functions.items():
        if newer is not None and found == OTHER_BODY:
            # a rolling upgrade: the migrations ran ahead of this code, and a newer revision
            # replaced the function (with the same arguments and results, as revisions must)
            out.append(Finding(f"{name}()", f"as revision {newer} defines it, a revision this "
                               "code does not know (the database was upgraded ahead of it)",
                               DIFFERS, "deploy the code of that revision"))
            continue
        out.append(Finding(f"{name}()", found, BREAKS, _FUNCTION_FIX if at_head_now
                           else "reconcile db upgrade"))
    return out


def newer_revision(conn: Connection, head: str | None = None) -> str | None:
    """The database's revision when it is a later release's (its migrations ran ahead of this
    code), else None. Strict: one row, holding a revision number greater than this code's head
    (the library numbers its revisions: ``0033``, ``0034``, …); a blank, odd or second row, an
    older or unknown name is no later release's, and the check stays as strict as at head.
    ``head``: :func:`head_revision`, when the caller has it already."""
    if _live_columns(conn, "reconcile_alembic_version") is None:
        return None
    current = conn.execute(text("SELECT version_num FROM reconcile_alembic_version")).scalars().all()
    head = head if head is not None else head_revision()
    if len(current) != 1 or not _NUMBERED.fullmatch(str(current[0])) \
            or not _NUMBERED.fullmatch(head):
        return None
    return str(current[0]) if int(current[0]) > int(head) else None


_NUMBERED = re.compile(r"[0-9]{1,9}")


_CHECKED: weakref.WeakKeyDictionary[Engine, bool] = weakref.WeakKeyDictionary()


def require(engine: Engine) -> list[Finding]:
    """The start-up check: raise :class:`SchemaMismatch` when a finding would break a request;
    log and return the rest. Once per engine (a process checks its database once); a database
    that cannot be reached now is checked by the next start-up (nothing is decided without it)."""
    if engine in _CHECKED or _not_created(engine):
        return []
    try:
        findings = check(engine)
    except exc.OperationalError as error:
        log.warning("reconcile_table_contract_unchecked database unreachable: %s",
                    str(error.orig or error).strip().splitlines()[0])
        return []
    for finding in findings:
        if finding.level == DIFFERS:
            log.warning("reconcile_table_contract %s", finding.line())
    breaking = [f for f in findings if f.level == BREAKS]
    if breaking:
        raise SchemaMismatch(breaking)
    _CHECKED[engine] = True
    return findings


def _not_created(engine: Engine) -> bool:
    """An SQLite file that does not exist yet: nothing to check, and a check must not create it
    (``reconcile db upgrade`` does, and the first request's error names the missing table)."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        return False
    return not os.path.exists(database)


# ----------------------------------------------------------------------------- usage_logs.id

@dataclass(frozen=True)
class _Shape:
    """What the library's writes read of the platform's tables: once per engine (a process's
    first write, or its start-up check), never on a request after that."""

    usage_log_ids_assigned: bool
    defaulted_not_null: frozenset[str]


_SHAPES: weakref.WeakKeyDictionary[Engine, _Shape] = weakref.WeakKeyDictionary()


def _shape(conn: Connection) -> _Shape:
    engine = conn.engine
    found = _SHAPES.get(engine)
    if found is None:
        usage_id = (_live_columns(conn, "usage_logs") or {}).get("id")
        jobs = _live_columns(conn, "jobs") or {}
        found = _SHAPES[engine] = _Shape(
            bool(usage_id and usage_id.default),
            frozenset(name for name, col in jobs.items()
                      if f"jobs.{name}" in FILLED_BY_DEFAULT and not col.nullable and col.default))
    return found


def usage_log_ids_assigned(conn: Connection) -> bool:
    """Whether the database assigns ``usage_logs.id`` (a default, an identity, SQLite's rowid
    alias); False: the library gives each usage log a uuid. Read once per engine."""
    return _shape(conn).usage_log_ids_assigned


def defaulted_not_null(conn: Connection) -> frozenset[str]:
    """The ``jobs`` columns of :data:`FILLED_BY_DEFAULT` that are NOT NULL with a default in this
    database: a submit with no value for one leaves it out, so the default fills it (elsewhere it
    writes NULL, as it always did: a nullable column's default never replaces the NULL the
    library means). Read once per engine, with :func:`usage_log_ids_assigned`."""
    return _shape(conn).defaulted_not_null


# ----------------------------------------------------------------------------- the docs


def contract_markdown() -> str:
    """The contract as the documentation's table (README, The table contract; a test keeps the
    two equal)."""
    lines = ["| table.column | accepted types | if missing |", "|---|---|---|"]
    for table in PLATFORM_TABLES:
        for col in columns(table):
            family = FAMILIES[col.family]
            accepted = family.name
            if col.family == "timestamp":
                accepted = "timestamptz, or timestamp (naive UTC)"
            elif col.family == "bigint":
                accepted = "bigint (integer: up to 2,147,483,647)"
            elif col.family == "integer":
                accepted = "integer or bigint"
            elif col.family == "text":
                accepted = "text or varchar"
            elif col.family == "numeric":
                accepted = "numeric, real, double precision or an integer"
            missing = "the platform's: required" if col.platform else "added by `reconcile db upgrade`"
            lines.append(f"| `{table}.{col.name}` | {accepted} | {missing} |")
    return "\n".join(lines)
