"""Internal: the built-in ledger's commit as one part of a caller's statement (PostgreSQL).

The completion runs the job's compare-and-set, this commit, the assets and the event as ONE
statement (``reconcile.lifecycle.completion``). The commit is the same installed function
``reconcile_ledger_commit`` the ledger calls on its own (:mod:`._pg_functions`), joined
``LATERAL`` to the row the caller locked: its arguments are :func:`._pg.commit_params`', bound
under the ``led_`` prefix, and its row means what :func:`._pg.commit_outcome` says it means.
Nothing here decides an amount: the caller passes the one the settlement policy decided.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, ColumnElement, Connection, Text, bindparam, cast, func
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP, UUID
from sqlalchemy.orm import Session
from sqlalchemy.sql.expression import TableValuedAlias
from sqlalchemy.sql.selectable import LateralFromClause
from sqlalchemy.types import TypeEngine

from ._base import Settlement, _now
from ._pg import COMMIT_FN, COMMIT_PARAMS, commit_outcome, commit_params, pg_amount_ok
from ._pg_functions import COMMIT_OUT

PREFIX = "led_"
_TYPES: dict[str, TypeEngine[Any]] = {
    "uuid": UUID(as_uuid=True), "bigint": BigInteger(), "text": Text(),
    "timestamptz": TIMESTAMP(timezone=True), "boolean": Boolean(), "jsonb": JSONB(),
}


def commit_call(job_id: ColumnElement[Any]) -> LateralFromClause:
    """``reconcile_ledger_commit(…)`` as a ``LATERAL`` table-valued function with its ``OUT``
    columns (``r_…``): the job's id is ``job_id``, a column of the row the caller locked (so the
    function runs only for that row, after its lock), every other argument a ``led_…`` bind
    cast to its declared type."""
    args = [job_id if name == "j" else
            cast(bindparam(PREFIX + name, type_=_TYPES[type_]), _TYPES[type_])
            for name, type_ in COMMIT_PARAMS]
    columns = [f"r_{name}" for name, _ in COMMIT_OUT]
    call: TableValuedAlias = getattr(func, COMMIT_FN)(*args).table_valued(*columns)
    return call.lateral("led_call")


def usable(conn: Connection, amount: int | None) -> bool:
    """Whether the commit of ``amount`` may run inline: PostgreSQL, and an amount its path
    takes (:func:`._pg.pg_amount_ok`); otherwise the caller commits on its own."""
    return conn.dialect.name == "postgresql" and pg_amount_ok(amount)


def params(job_id: uuid.UUID, amount: int | None, now: datetime | None,
           record: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The call's binds (``led_…``) for the job's commit of ``amount``."""
    return {PREFIX + k: v for k, v in commit_params(job_id, amount, _now(now), record).items()
            if k != "j"}


def outcome(session: Session, job_id: uuid.UUID, amount: int | None,
            row: Mapping[str, Any]) -> Settlement | None:
    """The commit's settlement from the caller's result row (its ``r_…`` columns); None: the
    function wrote nothing and the Core path decides (the caller commits as usual)."""
    values = tuple(row[f"r_{name}"] for name, _ in COMMIT_OUT)
    return commit_outcome(session, session.connection(), job_id, amount, values)
