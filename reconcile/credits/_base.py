"""Internal: the ledger's constants, deterministic transaction ids, result types and pure pool
arithmetic (no database)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..errors import (
    InsufficientCredits,
    InvalidParam,
    LedgerError,
)
from ..settlement import RECORD_KEY

POOLS = ("sub", "topup")
TERMINAL_JOB_STATUSES = ("completed", "failed", "cancelled")
LOT_PAGE = 32  # lots locked per FIFO page in reserve
# the library's own transaction-id prefixes: never accepted from outside (legacy imports)
RESERVED_PREFIXES = ("job-usage:", "job-commit:", "job-release:", "job-refund:", "job-recharge:")

Pools = tuple[int, int]  # (sub, topup)


# The settlement record in a usage log's metadata, on PostgreSQL: one CASE for the commit's CAS
# that merges a record (``record``: the SQL building ``{"settlement": {…}}``) and one for the CAS
# without a record, which drops a "settlement" key already there (a platform's own, copied or
# planted: a committed log's record is always its own commit's). ``col`` is the metadata column
# as the statement names it. A metadata that is not a JSON object is left as it is (a CASE per
# step: ``-`` and ``||`` raise on a scalar). The one-statement commit (_pg) and the Core path
# (_core) both use these.
def pg_metadata_with_record(col: str, record: str) -> str:
    return (f"CASE WHEN {col} IS NULL OR jsonb_typeof({col}::jsonb) = 'null' THEN {record} "
            f"WHEN jsonb_typeof({col}::jsonb) = 'object' THEN {col}::jsonb || {record} "
            f"ELSE {col}::jsonb END")


def pg_metadata_without_record(col: str) -> str:
    return (f"CASE WHEN jsonb_typeof({col}::jsonb) IS DISTINCT FROM 'object' THEN {col}::jsonb "
            f"WHEN {col}::jsonb ? '{RECORD_KEY}' THEN {col}::jsonb - '{RECORD_KEY}' "
            f"ELSE {col}::jsonb END")


def usage_txn_id(job_id: uuid.UUID) -> str:
    return f"job-usage:{job_id}"


def commit_txn_id(job_id: uuid.UUID) -> str:
    return f"job-commit:{job_id}"


def release_txn_id(job_id: uuid.UUID) -> str:
    return f"job-release:{job_id}"


def refund_txn_id(job_id: uuid.UUID) -> str:
    return f"job-refund:{job_id}"


def recharge_usage_txn_id(job_id: uuid.UUID) -> str:
    return f"job-recharge:{job_id}:usage"


def recharge_commit_txn_id(job_id: uuid.UUID) -> str:
    return f"job-recharge:{job_id}:commit"


@dataclass(frozen=True)
class Reservation:
    usage_log_id: uuid.UUID | int  # the platform's usage_logs.id: a uuid, or an integer
    job_id: uuid.UUID
    user_id: uuid.UUID
    amount: int
    from_sub: int
    from_topup: int


def _now(now: datetime | None) -> datetime:
    """The ledger write's time: ``now`` (aware; any zone, stored as that instant) or the clock.

    A naive ``now`` is refused before anything is written, on every path: the ORM columns
    refuse one (``UTCDateTime``), and the PostgreSQL one-statement paths, which bind it to
    ``timestamptz`` directly, would otherwise read it in the session's time zone."""
    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("naive datetime given as the ledger's now; use aware UTC")
    return now


def _check_amount(amount: Any, param: str = "credits") -> int:
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise InvalidParam(f"{param} must be an integer number of credits", param=param)
    if amount <= 0:
        raise InvalidParam(f"{param} must be greater than zero", param=param)
    return amount


def split_pro_rata(amount: int, from_sub: int, from_topup: int) -> tuple[int, int]:
    """``amount`` split between (sub, topup) in the ratio of the reservation; remainder to sub.

    Kept for callers; the ledger itself moves pools in order (:func:`take_in_order`)."""
    total = from_sub + from_topup
    if total <= 0:
        return amount, 0
    topup = amount * from_topup // total
    return amount - topup, topup


def take_in_order(amount: int, available: Pools, order: tuple[int, int] = (0, 1)) -> Pools:
    """``amount`` taken from ``available`` (sub, topup), the pool ``order[0]`` first."""
    taken = [0, 0]
    left = amount
    for index in order:
        taken[index] = min(left, max(0, available[index]))
        left -= taken[index]
    if left:
        raise LedgerError(f"cannot take {amount} from pools {available}")
    return taken[0], taken[1]


def take_from_lots(amount: int, lots: Iterable[tuple[Any, Any]]) -> tuple[list[tuple[Any, int]], int]:
    """Pure FIFO: ``amount`` taken from ``lots`` ((lot id, remaining), oldest first), each lot
    drained before the next. Returns each touched lot's new ``remaining_amount`` (in order) and
    how much was taken (less than ``amount`` when the lots run out). Lots after the one that
    completes ``amount`` are not touched."""
    changes: list[tuple[Any, int]] = []
    taken = 0
    for lot_id, remaining in lots:
        if taken == amount:
            break
        take = min(int(remaining), amount - taken)
        changes.append((lot_id, int(remaining) - take))
        taken += take
    return changes, taken


def _check_funds(balance: Pools, amount: int) -> None:
    if balance[0] + balance[1] < amount:
        raise InsufficientCredits(
            f"balance {balance[0] + balance[1]} is lower than the {amount} credits needed")


@dataclass(frozen=True)
class Settlement:
    """What :func:`settle_commit` did: ``done`` is the CAS (what :func:`commit` returns) and
    ``amount`` what the job finally cost when ``done`` (the committed amount; no re-read)."""

    done: bool
    amount: int | None = None

    def __bool__(self) -> bool:
        return self.done


_NOT_DONE = Settlement(False)

SETTLED_KEY = "reconcile.credits.settled"  # session.info: (job id, amount) of the last commit
