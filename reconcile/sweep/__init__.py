"""Internal: The reconcile sweep: one tick over in-flight and unsettled jobs.

A tick reads candidate rows in batches with ``SELECT … FOR UPDATE SKIP LOCKED`` (on SQLite a
plain select: ``BEGIN IMMEDIATE`` serialises writers). Inside that short transaction it decides
each row's action with the table (:func:`decide`, rows in order, first match wins) and writes
the action's *claim* — a compare-and-set that makes the row this tick's to handle:

=================  ==========================================================================
action             claim written under the row lock
=================  ==========================================================================
fail               the failure itself (``mark_failed`` from in flight), refund after commit
reenqueue          ``create_enqueue_count + 1``, ``create_enqueued_at = now`` (2-min spacing)
mark_uncertain     ``submitting`` → ``uncertain`` (the transition is the whole action)
poll, evidence     the attempt (``count_attempt``: at most once per 5 scaled minutes)
resume             a fresh lease and a new poll generation — the same one when it never took
                   a turn, its first turn sent again (``start_new_chain``)
anomaly            the anomaly row, once per job
settle             ``next_poll_at`` pushed on by a short lease; the ledger refunds once
=================  ==========================================================================

A second sweep either skips the locked row or, after the commit, finds the claim taken (the row
is terminal, its attempt or re-enqueue is not due, its lease is alive) and leaves it — so
overlapping ticks never handle a row twice. Slow I/O (provider reads, media, listings) happens
after the commit. Each row is isolated: an error is logged with the job id and counted, and the
tick goes on. Past its time budget a tick hands the remaining actionable rows to ``fan_out``
(the per-job task, which runs :func:`reconcile_job`) and counts them as still running; in batch
mode the rows the batch poller can read now (dead chains, made due by the page in one statement,
and rows due already) go to the poller instead (``claims.hand_over``).

The package: the pure decision table (:mod:`.table`: rows, :class:`Decision`, :class:`Action`,
no session and no I/O) apart from its executor — the claims (:mod:`.claims`, with the
runtime-facing :func:`decide`), carrying them out after the commit and the evidence lookup
(:mod:`.carry`), the tick's keyset walk, late completions and :func:`reconcile_job`
(:mod:`.tick`), and what a tick reports (:mod:`.report`).
"""

from __future__ import annotations

from .carry import LISTING_SLACK as LISTING_SLACK
from .claims import decide
from .report import SweepAction, SweepReport
from .table import RECOVERING as RECOVERING, SETTLE_GRACE as SETTLE_GRACE, Action, Decision
from .tick import (
    BATCH_SIZE as BATCH_SIZE,
    EVENT_REPUBLISH_AGE as EVENT_REPUBLISH_AGE,
    LATE_BATCH as LATE_BATCH,
    _cursor_of as _cursor_of,
    _phases as _phases,
    reconcile_job,
    reconcile_jobs,
    sweep,
)

# kept importable here, not exported (``x as x``): the tuning constants, and the keyset walk's
# statements (bench/fig_query.py, tests/integration/test_sweep_tick_guarantees.py)
__all__ = ["Action", "Decision", "SweepAction", "SweepReport", "decide", "reconcile_job", "reconcile_jobs", "sweep"]
