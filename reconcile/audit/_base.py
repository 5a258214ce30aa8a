"""Internal: what every audit check shares: the tables, :class:`Discrepancy`, the run's state
(:class:`_Audit`: the session, the clock, the incremental scope) and the touched users."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    Text,
    case,
    cast,
    func,
    or_,
    select,
    union,
)
from sqlalchemy.orm import Session

from ..db.models import CreditBalance, CreditLot, CreditTransaction, Job, UsageLog, table_of
from ..settings import Settings
from ..settlement import DEFAULT_POLICY, SettlementPolicy
from ..states import IN_FLIGHT

# Every check is one SQL statement that returns only the rows in breach (PostgreSQL and SQLite):
# the ledger is aggregated where it lives, so the full audit costs a few scans, not a Python loop
# over every row.

INCREMENTAL_MAX_USERS = 20_000  # more touched users than this: the full audit runs instead
T = table_of(CreditTransaction)
L = table_of(CreditLot)
B = table_of(CreditBalance)
U = table_of(UsageLog)
J = table_of(Job)


@dataclass(frozen=True)
class Discrepancy:
    kind: str
    user_id: uuid.UUID | None
    job_id: uuid.UUID | None
    detail: str


@dataclass
class _Audit:
    session: Session
    now: datetime
    grace: timedelta
    settings: Settings
    since: datetime | None
    policy: SettlementPolicy = DEFAULT_POLICY  # what a failed/cancelled job may keep

    def __post_init__(self) -> None:
        self.found: list[Discrepancy] = []
        self.sqlite = self.session.get_bind().dialect.name == "sqlite"
        # the incremental mode's users, found once; so many that the full audit is cheaper → full
        self.users: list[uuid.UUID] | None = None
        if self.since is not None:
            users = touched_users(self.session, self.since)
            if len(users) <= INCREMENTAL_MAX_USERS:
                self.users = sorted(users)

    def report(self, kind: str, user_id: Any, job_id: Any, detail: str) -> None:
        self.found.append(Discrepancy(kind, user_id, job_id, detail))

    def scoped(self, stmt: Select[Any], user_col: Any) -> Select[Any]:
        """``stmt`` limited to the touched users in the incremental mode."""
        if self.users is None:
            return stmt
        return stmt.where(user_col.in_(self.users))

    def job_text(self, col: Any) -> ColumnElement[str]:
        """A job id as the text inside a deterministic transaction id (``8-4-4-4-12``)."""
        if not self.sqlite:
            return cast(col, Text)
        h = func.lower(col)  # SQLite stores a Uuid as 32 hex characters
        parts = [func.substr(h, 1, 8), func.substr(h, 9, 4), func.substr(h, 13, 4),
                 func.substr(h, 17, 4), func.substr(h, 21, 12)]
        out: Any = parts[0]
        for part in parts[1:]:
            out = out + "-" + part
        return out  # type: ignore[no-any-return]


def touched_users_query(since: datetime) -> Any:
    """Users with a transaction, usage log or balance change since ``since``, a job finished
    since then, a job in flight, or a reservation held."""
    return union(
        select(T.c.user_id).where(T.c.created_at >= since),
        select(B.c.user_id).where(B.c.updated_at >= since),
        select(U.c.user_id).where(or_(U.c.created_at >= since, U.c.status == "reserved")),
        select(J.c.user_id).where(or_(J.c.completed_at >= since, J.c.status.in_(IN_FLIGHT))),
    )


def touched_users(session: Session, since: datetime) -> set[uuid.UUID]:
    return set(session.execute(select(touched_users_query(since).subquery().c.user_id)).scalars())


def _sum(cond: Any, col: Any) -> Any:
    return func.coalesce(func.sum(case((cond, col), else_=0)), 0)


def _count(cond: Any) -> Any:
    return func.coalesce(func.sum(case((cond, 1), else_=0)), 0)
