"""Internal: the library's own mechanics, not an import path for platforms (may move).

Every guarded write to ``jobs``: one compare-and-set UPDATE each, returning whether it won.

``False`` (or ``None``) always means "someone else got there first, or the row is no longer in
the state this step expects" — the caller then does nothing more. No other module inserts,
updates or deletes ``jobs`` rows, nor inserts ``credit_anomalies`` rows (:func:`record_anomaly`);
``tests/unit/test_single_writer.py`` enforces it. The shared predicates over ``jobs`` (in flight,
settlement pending or due, uncertain with its claim gone) live here too, as SQL expressions
with a Python twin where a caller decides on a loaded row.

The package is one writer split along its seams; callers use ``jobstore.X`` from here:

- :mod:`.predicates`: the shared predicates, the last error's code and the provider's status
  as it is stored;
- :mod:`.cas`: the compare-and-set primitive and :func:`load`;
- :mod:`.create`: the new row, the create claim and its outcomes, evidence adoption, re-enqueue;
- :mod:`.turns`: the poll turn (:func:`take_poll_turn`, its lease by kind and age);
- :mod:`.poll`: a new chain, attempts, the last error noted, progress;
- :mod:`.batch`: batch polling's claims and set-based writes;
- :mod:`.terminal`: failed / cancelled / completed, cost, settlement, re-charge, anomalies;
- :mod:`.workers`: worker heartbeats and the end of a dead worker's claims.

Beside the writer, the jobs layer's side tables (imported as ``reconcile.jobstore.X``, never
through this facade, and never writing ``jobs`` themselves — the single-writer test scans them):

- :mod:`.events`: the job-event outbox and its publisher, ``follow_job``;
- :mod:`.evidence`: which webhook delivery is evidence for which job;
- :mod:`.retention`: pruning job events and webhook deliveries;
- :mod:`.adoption`: the legacy-row rules (cutoff, age, observe-only names);
- :mod:`.horizon`: a job's exhaustion horizon (threshold, attempts, deadline), a pure rule.
"""

from __future__ import annotations

from .batch import (
    ReaderClaim,
    Rescheduled,
    claim_due,
    claim_due_with_times,
    claim_of,
    end_storing,
    hold_claim,
    hold_claims,
    hold_claims_with_status,
    hold_while_storing,
    make_due,
    make_due_all,
    make_due_at,
    not_storing,
    oldest_unclaimed_due,
    reschedule_claimed,
    under_claim,
    unschedule,
)
from .cas import load
from .create import (
    adopt_task_id,
    claim_create,
    claim_reenqueue,
    insert_job,
    insert_job_with_event,
    mark_platform_call,
    mark_uncertain,
    release_rate_limited,
    save_task_id,
)
from .poll import claim_attempt, count_attempt, note_error, set_progress, start_new_chain
from .predicates import (
    PROVIDER_STATUS_MAX,
    claim_expired,
    in_flight,
    is_outcome_unknown,
    is_settlement_due,
    is_settlement_pending,
    is_verdict,
    last_error_code,
    legacy_error_code,
    must_settle,
    outcome_known,
    platform_row_uncalled,
    settlement_due,
    settlement_pending,
    stored_status,
    uncertain_expired,
    unknown_outcome_in_flight,
)
from .terminal import (
    cancelled_over_failure,
    claim_settlement,
    completion_binds,
    completion_cas,
    completion_inserts,
    mark_completed,
    mark_failed,
    record_anomaly,
    record_cost,
    record_recharge,
    resolve_anomalies,
    settle_failed,
    settled,
    write_completion,
)
from .turns import LeaseSteps, take_poll_turn
from .workers import (
    end_claims_of,
    live_batch_claims,
    register_worker,
    remove_worker,
    renew_worker,
    take_lapsed_workers,
)

__all__ = [
    "PROVIDER_STATUS_MAX", "LeaseSteps", "ReaderClaim", "Rescheduled", "adopt_task_id", "cancelled_over_failure", "claim_attempt", "claim_create",
    "claim_due", "claim_of", "claim_due_with_times", "claim_expired", "claim_reenqueue", "claim_settlement",
    "count_attempt", "hold_claim", "hold_claims", "hold_claims_with_status", "end_storing", "hold_while_storing", "not_storing", "in_flight", "insert_job", "insert_job_with_event", "is_settlement_due",
    "is_settlement_pending", "is_verdict", "last_error_code", "legacy_error_code", "load",
    "completion_binds", "completion_cas", "completion_inserts",
    "make_due", "make_due_all", "make_due_at", "unschedule", "oldest_unclaimed_due", "mark_completed", "mark_failed", "mark_platform_call",
    "mark_uncertain", "note_error", "platform_row_uncalled", "record_anomaly", "record_cost", "record_recharge",
    "release_rate_limited", "resolve_anomalies", "reschedule_claimed", "under_claim", "save_task_id", "set_progress", "settle_failed",
    "settled", "settlement_due", "settlement_pending", "start_new_chain", "stored_status", "take_poll_turn",
    "uncertain_expired", "unknown_outcome_in_flight",
    "is_outcome_unknown", "must_settle", "outcome_known",
    "write_completion", "end_claims_of", "live_batch_claims", "register_worker", "remove_worker", "renew_worker", "take_lapsed_workers",
]
