"""Internal: the library's own mechanics, not an import path for platforms (may move).

A second ledger backend: a platform's own ``user_credits(user_id, sub, topup)`` balance table.

It shows how a platform keeps its billing and plugs it into the library
(``Runtime(ledger=PlatformLedger())``); the contract tests and the lifecycle tests run against it
as well as against the built-in ledger. It keeps no tables of its own: the balance lives in
``user_credits``, the reservation in the platform's ``usage_logs`` row, and what moved in that
row's ``metadata``:

* ``from_sub`` / ``from_topup`` — what the reservation took from each pool (``sub`` first);
* ``legacy_sub`` / ``legacy_topup`` — refunds the platform made before the library (partial
  ones included), per pool: what the reservation still holds is the rest;
* ``committed`` (+ ``committed_sub`` / ``committed_topup``) or ``refund`` (+ ``refund_sub`` /
  ``refund_topup``) — the settlement, written by the same CAS that moves the log's status.

A commit for less charges the pools in the order the reservation took them (``sub`` first) and
gives each pool back its own unsettled rest. Every operation locks the ``user_credits`` row
first, then CASes the usage log; each runs in a SAVEPOINT of the caller's transaction.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, Column, MetaData, Table, Uuid, select, update
from sqlalchemy.orm import Session

from ..credits import Discrepancy, Reservation
from ..db.models import UsageLog
from ..errors import InsufficientCredits, InvalidParam, LedgerError

POOLS = ("sub", "topup")

_meta = MetaData()
user_credits = Table(
    "user_credits", _meta,
    Column("user_id", Uuid, primary_key=True),
    Column("sub", BigInteger, nullable=False, server_default="0"),
    Column("topup", BigInteger, nullable=False, server_default="0"),
)

DDL = ("CREATE TABLE IF NOT EXISTS user_credits (user_id uuid PRIMARY KEY, "
       "sub bigint NOT NULL DEFAULT 0, topup bigint NOT NULL DEFAULT 0)")


def _now(now: datetime | None) -> datetime:
    return now or datetime.now(UTC)


def _int(meta: dict[str, Any], key: str) -> int:
    try:
        return int(meta.get(key) or 0)
    except (TypeError, ValueError):
        return 0


def unsettled(log: UsageLog) -> tuple[int, int]:
    """Per pool, what the reservation still holds (taken minus legacy refunds)."""
    meta = log.metadata_ if isinstance(log.metadata_, dict) else {}
    sub, topup = _int(meta, "from_sub"), _int(meta, "from_topup")
    if sub + topup != log.credits:  # a log the platform wrote without a usable split
        sub, topup = log.credits, 0
    return max(0, sub - _int(meta, "legacy_sub")), max(0, topup - _int(meta, "legacy_topup"))


class PlatformLedger:
    """Credits in the platform's ``user_credits`` table (see the module docstring)."""

    name = "platform"

    # ------------------------------------------------------------------ helpers

    def _lock(self, session: Session, user_id: uuid.UUID) -> dict[str, int] | None:
        row = session.execute(select(user_credits.c.sub, user_credits.c.topup)
                              .where(user_credits.c.user_id == user_id)
                              .with_for_update()).first()
        return None if row is None else {"sub": int(row.sub), "topup": int(row.topup)}

    def _add(self, session: Session, user_id: uuid.UUID, sub: int, topup: int) -> None:
        session.execute(update(user_credits).where(user_credits.c.user_id == user_id).values(
            sub=user_credits.c.sub + sub, topup=user_credits.c.topup + topup))

    def _first_log(self, session: Session, job_id: uuid.UUID) -> UsageLog | None:
        return session.execute(select(UsageLog).where(UsageLog.job_id == job_id)
                               .order_by(UsageLog.created_at, UsageLog.id).limit(1)
                               ).scalar_one_or_none()

    def _settle(self, session: Session, log: UsageLog, status: str, meta: dict[str, Any]) -> bool:
        """The CAS: ``reserved`` → ``status`` with the settlement recorded in the metadata."""
        merged = {**(log.metadata_ if isinstance(log.metadata_, dict) else {}), **meta}
        done = session.execute(
            update(UsageLog).where(UsageLog.id == log.id, UsageLog.status == "reserved")
            .values(status=status, metadata_=merged).returning(UsageLog.id),
            execution_options={"synchronize_session": False}).scalar_one_or_none()
        return done is not None

    def _reserved_log(self, session: Session, job_id: uuid.UUID) -> UsageLog | None:
        log = self._first_log(session, job_id)
        return log if log is not None and log.status == "reserved" else None

    # ------------------------------------------------------------------ the contract

    def reserve(self, session: Session, user_id: uuid.UUID, job_id: uuid.UUID, amount: int, *,
                now: datetime | None = None) -> Reservation:
        if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
            raise InvalidParam("credits must be greater than zero", param="credits")
        with session.begin_nested():
            balance = self._lock(session, user_id)
            existing = self._first_log(session, job_id)
            if existing is not None:
                meta = existing.metadata_ or {}
                return Reservation(existing.id, job_id, existing.user_id, existing.credits,
                                   _int(meta, "from_sub"), _int(meta, "from_topup"))
            have = 0 if balance is None else balance["sub"] + balance["topup"]
            if balance is None or have < amount:
                raise InsufficientCredits(
                    f"balance {have} is lower than the {amount} credits needed")
            sub = min(balance["sub"], amount)
            topup = amount - sub
            self._add(session, user_id, -sub, -topup)
            log_id = uuid.uuid4()
            session.add(UsageLog(id=log_id, job_id=job_id, user_id=user_id, status="reserved",
                                 credits=amount, created_at=_now(now),
                                 metadata_={"from_sub": sub, "from_topup": topup}))
            session.flush()
            return Reservation(log_id, job_id, user_id, amount, sub, topup)

    def commit(self, session: Session, job_id: uuid.UUID, amount: int | None = None, *,
               now: datetime | None = None) -> bool:
        with session.begin_nested():
            log = self._reserved_log(session, job_id)
            if log is None:
                return False
            self._lock(session, log.user_id)
            session.refresh(log)  # read what it holds under the balance lock
            held_sub, held_topup = unsettled(log)
            held = held_sub + held_topup
            amount = held if amount is None else amount
            if isinstance(amount, bool) or not isinstance(amount, int) or not 0 <= amount <= held:
                raise LedgerError(f"cannot commit {amount!r} of the {held} credits held for "
                                  f"job {job_id}")
            c_sub = min(amount, held_sub)  # the order the reservation took them: sub first
            c_topup = amount - c_sub
            if not self._settle(session, log, "committed", {
                    "committed": amount, "committed_sub": c_sub, "committed_topup": c_topup}):
                return False
            self._add(session, log.user_id, held_sub - c_sub, held_topup - c_topup)
            return True

    def refund(self, session: Session, job_id: uuid.UUID, *, now: datetime | None = None) -> bool:
        with session.begin_nested():
            log = self._reserved_log(session, job_id)
            if log is None:
                return False
            self._lock(session, log.user_id)
            session.refresh(log)
            sub, topup = unsettled(log)
            if not self._settle(session, log, "refunded", {
                    "refund": sub + topup, "refund_sub": sub, "refund_topup": topup}):
                return False
            self._add(session, log.user_id, sub, topup)
            return True

    def settled_amount(self, session: Session, job_id: uuid.UUID) -> int | None:
        log = self._first_log(session, job_id)
        if log is None or log.status == "refunded":
            return 0
        if log.status == "reserved":
            return None
        meta = log.metadata_ if isinstance(log.metadata_, dict) else {}
        return _int(meta, "committed") if "committed" in meta else sum(unsettled(log))

    def refunded(self, session: Session, job_id: uuid.UUID) -> int:
        """The refund, or what a commit for less released (held minus committed)."""
        log = self._first_log(session, job_id)
        meta = log.metadata_ if log is not None and isinstance(log.metadata_, dict) else {}
        if log is not None and log.status == "refunded":
            return _int(meta, "refund")
        if log is not None and log.status == "committed" and "committed" in meta:
            return max(0, sum(unsettled(log)) - _int(meta, "committed"))
        return 0

    def audit(self, session: Session, *, now: datetime | None = None,
              grace: timedelta = timedelta(minutes=10), **options: Any) -> list[Discrepancy]:
        """Negative pools; settled logs whose recorded settlement does not add up."""
        found: list[Discrepancy] = []
        for user_id, sub, topup in session.execute(
                select(user_credits.c.user_id, user_credits.c.sub, user_credits.c.topup)):
            for pool, value in (("sub", sub), ("topup", topup)):
                if value < 0:
                    found.append(Discrepancy("negative_balance", user_id, None, f"{pool}: {value}"))
        for log in session.execute(select(UsageLog).where(
                UsageLog.status.in_(("committed", "refunded")))).scalars():
            meta = log.metadata_ if isinstance(log.metadata_, dict) else {}
            key = "committed" if log.status == "committed" else "refund"
            if key not in meta:
                continue  # settled by the platform before the library: not ours to check
            parts = _int(meta, f"{key}_sub") + _int(meta, f"{key}_topup")
            if parts != _int(meta, key) or _int(meta, key) > sum(unsettled(log)):
                found.append(Discrepancy("settlement_mismatch", log.user_id, log.job_id,
                                         f"{key} {meta.get(key)} vs parts {parts}"))
        return found

    # ------------------------------------------------------------------ platform side

    def grant(self, session: Session, user_id: uuid.UUID, pool: str, amount: int) -> None:
        """Add credits (the platform's own top-up path; not part of the contract)."""
        if pool not in POOLS:
            raise InvalidParam(f"pool must be one of {POOLS}", param="pool")
        from sqlalchemy.dialects.postgresql import insert

        session.execute(insert(user_credits).values(user_id=user_id, sub=0, topup=0)
                        .on_conflict_do_nothing(index_elements=["user_id"]))
        self._lock(session, user_id)
        self._add(session, user_id, amount if pool == "sub" else 0,
                  amount if pool == "topup" else 0)

    def legacy_refund(self, session: Session, job_id: uuid.UUID, amount: int) -> None:
        """A refund the platform made before the library on a log still reserved (sub first
        back, like its old code did), recorded per pool in the log's metadata."""
        log = self._reserved_log(session, job_id)
        if log is None:
            raise InvalidParam(f"job {job_id} holds no reservation", param="job_id")
        self._lock(session, log.user_id)
        sub, topup = unsettled(log)
        if amount > sub + topup:
            raise InvalidParam("a legacy refund cannot exceed what is held", param="amount")
        back_sub = min(amount, sub)
        back_topup = amount - back_sub
        meta = dict(log.metadata_ or {})
        meta["legacy_sub"] = _int(meta, "legacy_sub") + back_sub
        meta["legacy_topup"] = _int(meta, "legacy_topup") + back_topup
        session.execute(update(UsageLog).where(UsageLog.id == log.id).values(metadata_=meta),
                        execution_options={"synchronize_session": False})
        self._add(session, log.user_id, back_sub, back_topup)

    def balance(self, session: Session, user_id: uuid.UUID) -> tuple[int, int]:
        row = session.execute(select(user_credits.c.sub, user_credits.c.topup)
                              .where(user_credits.c.user_id == user_id)).first()
        return (0, 0) if row is None else (int(row.sub), int(row.topup))


def create_table(session: Session) -> None:
    """The platform's balance table, for tests and the example (a platform already has it)."""
    session.connection().exec_driver_sql(DDL)
