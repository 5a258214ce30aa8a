"""Internal: the library's own mechanics, not an import path for platforms (may move).

Bring a platform's balances and in-flight reservations into the built-in ledger
(``reconcile credits import``), so ``reconcile audit`` is clean on day one.

Run it at cut-over, once the platform's billing code stops writing its own balance table. It is
idempotent and re-runnable (every write has a deterministic id; a second run adds only what is
new) and never writes a platform row. Each part runs alone with ``only`` (``--only balances`` /
``--only reservations``), both by default:

* **Balances.** Each row of the platform's balance table (default ``user_credits(user_id, sub,
  topup)``) is *available* credit. Each non-zero pool becomes one grant ``import:{user}:{pool}``.
  A user already imported is skipped (balances are not re-synced: import once, at cut-over), and
  so is a user the ledger already holds a balance for: any grant under other ids (the
  platform granted it itself, ``credits.grant``) is the user's balance, never granted twice.
* **Reservations.** Each ``usage_logs`` row still ``reserved`` without the library's
  ``job-usage:{job}`` becomes a library reservation: its credits are granted into the pools it
  came from (``import-hold:{job}:{pool}``), that lot is consumed at once, and the USAGE
  transaction ``job-usage:{job}`` records the split — so a later refund returns each pool its
  own part and a later commit charges it. The split is ``metadata.from_sub`` /
  ``metadata.from_topup`` when they are non-negative integers summing to the log's credits.
  **Otherwise the rule is: all of it from ``sub``** (subscription credits are spent first, and
  it is the pool the library's own refund uses for a log without a split); when the two fields
  are present but do not add up, they are scaled to the log's credits pro rata (remainder to
  ``sub``), as the library's refund would split it. Every row decided by a rule is reported.
  A log created after its user's balance entered the ledger (the user's first grant before this
  run, ``import-hold:`` aside) is **not** imported: billing code outside the library reserved
  it from the platform's own table after cut-over, so the ledger's balance still holds those
  credits and a fresh grant would fund them twice. It is reported; settle it on the platform's
  side.
* A log without a ``job_id`` (the ledger's transactions name a job), a job with more than one
  reserved log, or a negative balance is reported and skipped: fix it on the platform's side
  and re-run.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import column, func, select, table
from sqlalchemy.orm import Session

from .. import credits
from ..db.models import CreditLot, CreditTransaction, UsageLog


@dataclass
class ImportSummary:
    dry_run: bool
    users: int = 0
    users_skipped: int = 0  # already imported
    users_granted_already: int = 0  # the ledger held their balance (granted under other ids)
    granted: dict[str, int] = field(default_factory=lambda: {"sub": 0, "topup": 0})
    reservations: int = 0
    reservations_skipped: int = 0  # already the library's
    reserved: dict[str, int] = field(default_factory=lambda: {"sub": 0, "topup": 0})
    assumed: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def line(self) -> str:
        verb = "would import" if self.dry_run else "imported"
        return (f"[reconcile] credits import {verb} users={self.users} "
                f"sub={self.granted['sub']} topup={self.granted['topup']} "
                f"reservations={self.reservations} reserved_sub={self.reserved['sub']} "
                f"reserved_topup={self.reserved['topup']} skipped_users={self.users_skipped} "
                f"skipped_reservations={self.reservations_skipped} "
                f"granted_already={self.users_granted_already} assumed={len(self.assumed)} "
                f"problems={len(self.problems)}")


def split_of(log: UsageLog) -> tuple[int, int, str | None]:
    """(from_sub, from_topup, the rule applied or None when the metadata said it exactly)."""
    meta = log.metadata_ if isinstance(log.metadata_, dict) else {}
    raw = (meta.get("from_sub"), meta.get("from_topup"))
    if all(v is None for v in raw):
        return log.credits, 0, "no from_sub/from_topup: all from sub"
    try:
        sub, topup = (int(v or 0) for v in raw)
    except (TypeError, ValueError):
        return log.credits, 0, f"unreadable split {raw!r}: all from sub"
    if sub < 0 or topup < 0:
        return log.credits, 0, f"negative split {raw!r}: all from sub"
    if sub + topup == log.credits:
        return sub, topup, None
    s, t = credits.split_pro_rata(log.credits, sub, topup)
    return s, t, f"split {sub}+{topup} != {log.credits}: scaled pro rata"


def _balances(session: Session, source: str, user_col: str, sub_col: str,
              topup_col: str) -> list[tuple[uuid.UUID, int, int]]:
    t = table(source, column(user_col), column(sub_col), column(topup_col))
    rows = session.execute(select(t.c[user_col], t.c[sub_col], t.c[topup_col])
                           .order_by(t.c[user_col])).all()
    return [(u if isinstance(u, uuid.UUID) else uuid.UUID(str(u)), int(s or 0), int(p or 0))
            for u, s, p in rows]


_BALANCE_IDS = "import:"  # import:{user}:{pool}
_HOLD_IDS = "import-hold:"  # import-hold:{job}:{pool}: a reservation's credits, not a balance


def _balance_grants(session: Session) -> dict[uuid.UUID, datetime]:
    """Per user with a balance in the ledger, when its first grant was made (``import-hold:``
    aside: a reservation's credits, not a balance)."""
    t = CreditTransaction
    rows = session.execute(
        select(t.user_id, func.min(t.created_at))
        .where(t.type == "GRANT", ~t.id.startswith(_HOLD_IDS, autoescape=True))
        .group_by(t.user_id))
    return {user: first for user, first in rows}


def _import_balance(session: Session, summary: ImportSummary, user: uuid.UUID, sub: int,
                    topup: int, now: datetime, granted: dict[uuid.UUID, datetime]
                    ) -> None:
    if sub < 0 or topup < 0:
        summary.problems.append(f"user {user}: negative balance sub={sub} topup={topup}; skipped")
        return
    ids = {pool: f"{_BALANCE_IDS}{user}:{pool}" for pool in credits.POOLS}
    if any(session.get(CreditTransaction, i) is not None for i in ids.values()):
        summary.users_skipped += 1
        return
    if user in granted:  # granted under other ids (the platform's): the ledger holds its balance
        summary.users_granted_already += 1
        return
    summary.users += 1
    for pool, amount in (("sub", sub), ("topup", topup)):
        if amount > 0:
            summary.granted[pool] += amount
            if not summary.dry_run:
                credits.grant(session, user, pool, amount, ids[pool], now=now)


def _hold(session: Session, user: uuid.UUID, pool: str, amount: int, txn_id: str,
          now: datetime) -> None:
    """Grant ``amount`` into ``pool`` and consume that very lot: credits held, not available."""
    credits.grant(session, user, pool, amount, txn_id, now=now)
    lot = session.execute(select(CreditLot).where(CreditLot.source_txn_id == txn_id)
                          .with_for_update()).scalar_one()
    balance = credits.lock_balance(session, user)
    lot.remaining_amount = 0
    setattr(balance, pool, getattr(balance, pool) - amount)


def _import_reservation(session: Session, summary: ImportSummary, log: UsageLog,
                        now: datetime, granted: dict[uuid.UUID, datetime]) -> None:
    assert log.job_id is not None
    key = str(log.job_id)
    usage_id = credits.usage_txn_id(log.job_id)
    if session.get(CreditTransaction, usage_id) is not None:
        summary.reservations_skipped += 1
        return
    cut_over = granted.get(log.user_id)
    if cut_over is not None and log.created_at is not None and log.created_at > cut_over:
        summary.problems.append(
            f"usage log {log.id} (job {log.job_id}, {log.credits} credits) was reserved at "
            f"{log.created_at.isoformat()}, after user {log.user_id}'s balance entered the ledger "
            f"({cut_over.isoformat()}): billing code outside the library reserved it from the "
            f"platform's own table, and the ledger's balance still holds those credits; not "
            f"imported (settle it on the platform's side)")
        return
    sub, topup, rule = split_of(log)
    if rule is not None:
        summary.assumed.append({"usage_log_id": str(log.id), "job_id": str(log.job_id),
                                "credits": log.credits, "from_sub": sub, "from_topup": topup,
                                "rule": rule})
    summary.reservations += 1
    summary.reserved["sub"] += sub
    summary.reserved["topup"] += topup
    if summary.dry_run:
        return
    for pool, part in (("sub", sub), ("topup", topup)):
        if part > 0:
            _hold(session, log.user_id, pool, part, f"import-hold:{key}:{pool}", now)
    session.add(CreditTransaction(id=usage_id, user_id=log.user_id, job_id=log.job_id,
                                  type="USAGE", amount=log.credits, from_sub=sub,
                                  from_topup=topup, created_at=now))
    session.flush()


PARTS = ("balances", "reservations")


def import_credits(session: Session, *, now: datetime, dry_run: bool = False,
                   source: str = "user_credits", user_column: str = "user_id",
                   sub_column: str = "sub", topup_column: str = "topup",
                   only: str | None = None) -> ImportSummary:
    """Import in the caller's transaction (the caller commits; a dry run writes nothing).
    ``only``: ``"balances"`` or ``"reservations"`` (default: both)."""
    if only is not None and only not in PARTS:
        raise ValueError(f"only must be one of {PARTS}, not {only!r}")
    summary = ImportSummary(dry_run=dry_run)
    granted = _balance_grants(session)  # before this run: its own grants are not a cut-over
    if only != "reservations":
        for user, sub, topup in _balances(session, source, user_column, sub_column, topup_column):
            _import_balance(session, summary, user, sub, topup, now, granted)
    if only != "balances":
        _import_reservations(session, summary, now, granted)
    return summary


def _import_reservations(session: Session, summary: ImportSummary, now: datetime,
                         granted: dict[uuid.UUID, datetime]) -> None:
    logs = list(session.execute(select(UsageLog).where(UsageLog.status == "reserved")
                                .order_by(UsageLog.created_at, UsageLog.id)).scalars())
    per_job: dict[uuid.UUID, int] = {}
    for log in logs:
        if log.job_id is not None:
            per_job[log.job_id] = per_job.get(log.job_id, 0) + 1
    for log in logs:
        if log.job_id is None:
            summary.problems.append(f"usage log {log.id}: reserved without a job_id; skipped")
            continue
        if per_job[log.job_id] > 1:
            summary.problems.append(f"job {log.job_id}: {per_job[log.job_id]} reserved usage "
                                    f"logs; log {log.id} skipped")
            continue
        _import_reservation(session, summary, log, now, granted)
