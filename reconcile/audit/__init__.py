"""Internal: the library's own mechanics, not an import path for platforms (may move).

The ledger audit: a proof of conservation, per job, per pool and per user.

An empty list means the ledger balances. The audit reads the library's tables (and the jobs it
knows) and never writes. What it proves:

* **Per transaction**: ``amount = from_sub + from_topup``, nothing negative, and an id under the
  library's own prefixes (``job-usage:`` …) names its type and job (``txn_split_mismatch``,
  ``txn_id_mismatch``).
* **Per job** the ledger knows (it has a ``job-usage:{job}`` USAGE row, written or imported),
  per pool: ``USAGE (+ re-charge USAGE) = COMMIT (+ re-charge COMMIT) + RELEASE + REFUND +
  legacy refunds + what is still held`` (``commit_exceeds_reservation``, ``job_unbalanced``,
  ``pool_mismatch``, ``legacy_refund_exceeds_reservation``); the usage log agrees (one log, one
  ``reserved`` at most, its credits = the USAGE amount, its status = the settlement:
  ``usage_log_missing``, ``duplicate_reserved_log``, ``usage_amount_mismatch``,
  ``settled_twice``, ``reserved_but_settled``, ``settlement_missing``); and the job row agrees
  (``failed_job_committed`` unless the commit is what the given settlement policy keeps or
  what the share recorded with it keeps, recomputed: :mod:`reconcile.settlement`,
  ``completed_after_refund`` unless re-charged,
  ``credits_actual_mismatch``, ``terminal_job_reserved`` past the grace,
  ``in_flight_past_horizon``). A COMMIT/RELEASE/REFUND for a job with no USAGE row is
  ``refund_without_reservation`` / ``settlement_without_reservation``.
* **Per job row** (what a platform may change under the ledger): a reservation held past the
  grace whose job row was deleted (``orphaned_reservation``: ``reconcile credits
  release-orphan`` releases it); a job ``pending``/``processing`` whose reservation the library
  committed or refunded before the grace (``settled_job_in_flight``: a terminal status moved
  back), or whose completion's assets are stored (``completed_job_in_flight``, at once); a job whose ``user_id`` is not the user its USAGE row charged (``job_user_mismatch``);
  a usage log whose ``user_id`` is not that user, or without a USAGE row its job's
  (``usage_log_user_mismatch``: a settlement would pay the log's user).
* **Per lot**: ``0 ≤ remaining ≤ amount`` (``negative_lot``, ``lot_out_of_range``); every GRANT,
  RELEASE and REFUND transaction has exactly the lots it says, per pool
  (``grant_lot_mismatch``, ``release_lot_mismatch``, ``refund_lot_mismatch``), and no lot lacks
  its transaction (``lot_without_txn``).
* **Per user**, per pool: balance = Σ open lots (``balance_mismatch``, ``negative_balance``,
  ``balance_missing`` when lots or transactions exist without a balance row); what the lots gave
  up = Σ USAGE (``lot_consumption_mismatch``: credits taken from a lot with no transaction);
  and granted = balance + held + committed (``unbalanced``).

Legacy refunds are counted exactly as the ledger counts them: a REFUND for the job under any id
but ``job-refund:{job}`` (:func:`reconcile.credits.legacy_refunded`). Platform rows from before
adoption without a USAGE row are outside the per-job classes until imported.

**The in-flight horizon.** A job still ``pending``/``processing`` must be failed by the time its
kind allows (README, Design notes: Attempts and exhaustion; the rule: ``jobstore.horizon``): a
sync kind at its threshold, or when its call's claim ends if later; an async kind once its attempts are spent,
``max(start + threshold, last attempt) + (MAX_ATTEMPTS − attempts) × 5 min`` (all scaled by
``TIME_SCALE``; attempts beyond the maximum move it back), plus the grace and one sweep interval of slack. An ``uncertain`` job (held on
purpose), an observe-only kind and a kind this process does not know are excepted.

**Incremental mode** (``since``): the users touched since the watermark (a transaction, a usage
log, a balance update or a job finishing since then), plus every user with a job in flight or a
reservation held, and everything of theirs, checked with the same rules. It cannot replace the
full audit: lots change in place (``remaining_amount`` carries no time), and a platform can
rewrite a usage log or a job without any timestamp moving, so damage to a user untouched since
the watermark is invisible to it. Run it often; run the full audit as the proof. (Finding the
touched users scans the transactions' ``created_at``, which has no index; past
``INCREMENTAL_MAX_USERS`` touched users the full audit runs instead.)
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..settings import Settings
from ..settlement import DEFAULT_POLICY, SettlementPolicy
from ._base import INCREMENTAL_MAX_USERS, Discrepancy, _Audit, touched_users, touched_users_query
from ._jobs import _in_flight, _jobs
from ._ledger import _lots, _transactions, _users, identity
from ._rows import _job_rows

__all__ = ["INCREMENTAL_MAX_USERS", "Discrepancy", "run", "touched_users", "touched_users_query",
           "user_identity"]


def run(session: Session, *, now: datetime, grace: timedelta = timedelta(minutes=10),
        settings: Settings | None = None, since: datetime | None = None,
        policy: SettlementPolicy | None = None) -> list[Discrepancy]:
    """The full audit, or with ``since`` the incremental one (see the module docstring).
    ``policy``: the settlement policy failed and cancelled jobs were settled under — the
    deployment's, ``settings.settlement_policy`` (``RECONCILE_FAILURE_REFUND`` /
    ``CANCEL_REFUND``), when not given; a policy that differs from the given settings' raises
    ``ValueError`` (the audit checks what every process settles with). Without either: the
    default, everything refunded. Its shares are checked again as :class:`SettlementPolicy`
    checks them (:meth:`SettlementPolicy.checked`, ValueError): a share set past those checks
    (``object.__setattr__``, an unpickled copy, a subclass skipping ``__post_init__``)."""
    if policy is not None:
        policy = policy.checked()
        if settings is not None and policy != settings.settlement_policy:
            raise ValueError(f"the audit's policy {policy} differs from the settings' "
                             f"{settings.settlement_policy}: set RECONCILE_FAILURE_REFUND / "
                             "RECONCILE_CANCEL_REFUND, the one policy of the deployment")
    elif settings is not None:
        policy = settings.settlement_policy
    a = _Audit(session, now, grace, settings or Settings.model_construct(), since,
               policy or DEFAULT_POLICY)
    if not a.sqlite:
        # PostgreSQL's JIT compiles these wide aggregates for tens of seconds before the first
        # row (measured: 25 s of a 26 s audit on 100k rows); off for this transaction only
        session.execute(text("SET LOCAL jit = off"))
    for check in (_transactions, _lots, _users, _jobs, _in_flight, _job_rows):
        check(a)
    return a.found


def user_identity(session: Session, user_id: uuid.UUID, *, now: datetime) -> dict[str, Any] | None:
    """One user's per-user identity, as the audit checks it (the same statement, scoped to the
    user): per pool, balance = Σ open lots and what the lots gave up = Σ USAGE; granted =
    balance + held + committed. The figures, and ``findings``: the discrepancies the audit
    reports for the user (empty: the identity holds). None: the ledger has nothing of the user."""
    a = _Audit(session, now, timedelta(minutes=10), Settings.model_construct(), None)
    a.users = [user_id]
    return identity(a)
