"""The credit ledger: reserve → commit (optionally for less) or refund, exact and idempotent.

* A balance row per user holds one balance per pool (``sub``, ``topup``); it is locked
  (``SELECT … FOR UPDATE``; on SQLite the ``BEGIN IMMEDIATE`` write lock) by every operation
  that moves credits, always first, so concurrent writers serialise on it and never deadlock.
  The lock always reloads the row (``populate_existing``): a balance object the session already
  holds from an earlier read is never trusted.
* Credits live in lots whose ``remaining_amount`` is consumed oldest first. A reservation drains
  the ``sub`` pool before ``topup`` (subscription credits are spent first), FIFO within a pool,
  and records ``from_sub``/``from_topup`` on its USAGE transaction (and in ``usage_logs.metadata``
  for the platform). The USAGE row is the ledger's own record of the pools; the metadata is read
  only for a reservation the ledger never wrote (a platform's own). A commit given a settlement
  ``record`` (a failed/cancelled job's partial refund) merges it into the same metadata under
  ``"settlement"``, with the committed amount as ``kept``, in the CAS itself; a commit without
  one drops a ``"settlement"`` key already there; the audit checks it
  (:mod:`reconcile.settlement`).
* Every movement is an append-only transaction with a deterministic id: ``job-usage:{job}``,
  ``job-commit:{job}``, ``job-release:{job}``, ``job-refund:{job}``, and a deliberate re-charge
  after a refund ``job-recharge:{job}:usage`` + ``job-recharge:{job}:commit``; grants carry the
  caller's id. Repeating an operation is a no-op that returns False. The ``job-…:`` prefixes
  are the library's own: an imported legacy refund or a grant may not use them, nor the lot id
  of another transaction (a RELEASE/REFUND ``x`` writes the lots ``x:sub``/``x:topup``).
* Pools are conserved one by one (README, Design notes: Pools). A commit takes from the pools in the order the
  reservation consumed them (``sub`` first); each pool's release is what it reserved minus what
  it committed; a refund restores exactly each pool's unsettled remainder. Every COMMIT,
  RELEASE and REFUND row records per pool what moved.
* Legacy refunds (REFUND transactions for the job under ids other than ``job-refund:{job}``,
  partial ones included) count toward what is already refunded: a legacy refund ``p`` on a
  reservation ``a`` still ``reserved`` shrinks what it holds to ``a − p``. An import is bounded
  by what is still held and returns it in the reverse order of consumption (``topup`` first), so
  a legacy partial refund followed by a commit moves the pools exactly as a commit for less.

Credits are integers. Each function runs inside the caller's transaction and never commits. The
operations are SQLAlchemy Core (no ORM object graphs); every error is raised before the
operation's first write. On PostgreSQL reserve, commit and refund are each the balance lock plus
one statement of data-modifying CTEs (the FIFO walk, the ``ON CONFLICT`` USAGE insert, the CAS),
so they need no SAVEPOINT, run by a PL/pgSQL function in one round trip (:mod:`._pg_functions`,
installed by revision 0029); :func:`settle_commit` returns the committed amount with the CAS. Writes
of more than one statement (grant, legacy imports, re-charges, the Core paths) run inside one
SAVEPOINT (:func:`_all_or_nothing`): an exception between two of them leaves nothing written.
The audit lives in :mod:`reconcile.audit`; :func:`audit` here is its entry point.

The package, one module a concern (all private; this module is the import path):
:mod:`._base` (constants, transaction ids, result types, the pure pool arithmetic),
:mod:`._core` (the shared Core statements and helpers: lock, SAVEPOINT, lots, FIFO consume),
:mod:`._pools` (what a reservation took and holds per pool; usage-metadata repair),
:mod:`._pg` (the PostgreSQL one-statement paths), :mod:`._pg_functions` (their PL/pgSQL
functions), :mod:`._reserve`, :mod:`._settle` (commit, refund), :mod:`._legacy` (legacy refund
import) and :mod:`._grants` (grant, re-charge, settled amount, history).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from ..errors import (
    InsufficientCredits as InsufficientCredits,
    LedgerError as LedgerError,
)  # noqa: F401 (callers use credits.X)
from ._base import (  # noqa: F401 (NOT_EXPORTED names: for the library itself)
    LOT_PAGE as LOT_PAGE,
    POOLS as POOLS,
    RESERVED_PREFIXES as RESERVED_PREFIXES,
    SETTLED_KEY as SETTLED_KEY,
    TERMINAL_JOB_STATUSES as TERMINAL_JOB_STATUSES,
    Pools as Pools,
    Reservation as Reservation,
    Settlement as Settlement,
    _now as _now,
    commit_txn_id as commit_txn_id,
    recharge_commit_txn_id as recharge_commit_txn_id,
    recharge_usage_txn_id as recharge_usage_txn_id,
    refund_txn_id as refund_txn_id,
    release_txn_id as release_txn_id,
    split_pro_rata as split_pro_rata,
    take_from_lots as take_from_lots,
    take_in_order as take_in_order,
    usage_txn_id as usage_txn_id,
)
from ._core import (
    lock_balance as lock_balance,
)  # noqa: F401
from ._grants import (
    grant as grant,
    history as history,
    recharge as recharge,
    returned as returned,
    settled_amount as settled_amount,
)  # noqa: F401
from ._legacy import (
    import_legacy_refund as import_legacy_refund,
)
from ._pools import (  # noqa: F401
    _reserved_log as _reserved_log,
    held_pools as held_pools,
    legacy_refunded as legacy_refunded,
    legacy_refunded_pools as legacy_refunded_pools,
    repair_usage_metadata as repair_usage_metadata,
    reservation_pools as reservation_pools,
)
from ._reserve import (
    reserve as reserve,
)
from ._settle import (
    commit as commit,
    refund as refund,
    release_orphan as release_orphan,
    settle_commit as settle_commit,
)  # noqa: F401

if TYPE_CHECKING:
    from ..audit import Discrepancy as Discrepancy
    from ..settings import Settings
    from ..settlement import SettlementPolicy

__all__ = [
    "POOLS", "Pools", "RESERVED_PREFIXES", "Reservation", "Settlement", "audit", "commit",
    "grant", "history", "import_legacy_refund", "recharge", "refund", "release_orphan",
    "repair_usage_metadata", "reserve", "split_pro_rata",
]

# ----------------------------------------------------------------------------- audit


def audit(session: Session, *, now: datetime | None = None,
          grace: timedelta = timedelta(minutes=10), settings: Settings | None = None,
          since: datetime | None = None,
          policy: SettlementPolicy | None = None) -> list[Discrepancy]:
    """Every way the ledger is out of balance (an empty list means clean): see
    :mod:`reconcile.audit`. ``since`` runs the incremental audit (what was touched since);
    ``policy`` is the settlement policy failed and cancelled jobs were settled under (default:
    ``settings.settlement_policy``, the deployment's; without settings, everything refunded)."""
    from ..audit import run

    return run(session, now=_now(now), grace=grace, settings=settings, since=since, policy=policy)


def __getattr__(name: str) -> Any:  # ``credits.Discrepancy`` kept for callers
    if name == "Discrepancy":
        from ..audit import Discrepancy

        return Discrepancy
    raise AttributeError(name)
