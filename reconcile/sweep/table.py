"""Internal: the sweep's decision table, pure — the row, its kind, plain settings and a time in,
a :class:`Decision` out.

No session, no I/O, no runtime: :func:`decide` is handed the ``jobs`` row, its registered kind
(None: unknown), the :class:`~reconcile.settings.Settings` values and the tick's time, plus the
legacy cutoff its caller read (only needed where :func:`needs_legacy_cutoff` says so). The rows
are tried in order; the first that matches wins:

==  =========================  ============================================================
 1  legacy                     a row nobody submitted, no kind or one unknown here: bounded
 2  unknown_kind (platform)    such a row of an unknown kind that ``legacy`` fails not: one anomaly
 3  unknown_kind               any other unknown kind (submitted, task id): one anomaly
 4  platform_untracked         a platform row, known kind, no upstream handle: as sync
 5  platform_task              a platform row with a task id: as accepted, past threshold
 6  not_started                the create never ran (async): re-enqueue, bounded
 7  not_started_sync           a sync request that died before it ran: fail when stale
 8  submitting                 a create in progress: left while its claim lives
 9  submitting_expired         its claim gone: uncertain (async) / fail when stale (sync)
10  accepted                   poll once when an attempt is due (past the threshold)
11  accepted (resume)          a dead poll chain: a new generation (turnless: sent again)
12  uncertain                  look for evidence every 5 minutes
13  unsettled                  a failed/cancelled job whose refund is due: settle
==  =========================  ============================================================

A row function reads one :class:`_Row`: the job's columns (``r.job``), its kind, the settings,
the time, and the provider's last status stored on the row (``r.provider_status``:
``jobs.provider_status``, the raw token of the latest read of the job in flight, bounded; None
until a read stored one — README, The provider's last status). No row reads the status today; a
rule about a status is one row function in ``_TABLE``, at its place in the order.

The executor (:mod:`.claims`, :mod:`.carry`, :mod:`.tick`) writes each action's claim and
carries it out from the :class:`Decision` alone (its action, code, guard, ``resume`` and
``observable``; never the row's name); ``reconcile.sweep.decide(rt, job, now)`` is the
runtime-facing wrapper.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from ..db.models import Job
from ..errors import ErrorCode
from ..jobstore import adoption, horizon
from ..jobstore.predicates import is_settlement_due
from ..kinds import Kind
from ..settings import Settings
from ..states import (
    ATTEMPT_SPACING,
    IN_FLIGHT,
    MAX_CREATE_REENQUEUES,
    NOT_STARTED_AGE,
    Status,
    Submission,
)

# whoever persists a failure settles it right after; the sweep steps in only once a due
# settlement has waited this long (so it never races a live settler, its own included)
SETTLE_GRACE = timedelta(seconds=30)


class Action(StrEnum):
    LEAVE = "leave"
    FAIL = "fail"
    REENQUEUE = "reenqueue"
    MARK_UNCERTAIN = "mark_uncertain"
    POLL = "poll"
    RESUME = "resume"
    EVIDENCE = "evidence"
    ANOMALY = "anomaly"
    SETTLE = "settle"


# actions that try to bring a job to its result (a dry run's would_recover)
RECOVERING = ("poll", "resume", "evidence", "reenqueue")


class Guard(StrEnum):
    """An extra condition a decision's write holds to (the row's state when it was decided)."""

    #: the create still never ran (a create that started meanwhile is not failed as unstarted)
    STILL_NOT_STARTED = "still_not_started"


@dataclass(frozen=True)
class Decision:
    """Which table row matched (``row``, by name) and what to do. The executor writes whatever
    the decision carries and never compares row names:

    * ``resume``: poll, then a new chain;
    * ``code``: the error code a ``FAIL`` stores on the job (a new failing row names its own);
    * ``guard``: what the row's write also requires (:class:`Guard`), beyond the action's own
      compare-and-set;
    * ``observable``: a ``FAIL`` that ``LEGACY_SWEEP=observe`` only logs (the legacy rows).
    """

    row: str
    action: Action
    resume: bool = False
    code: ErrorCode = ErrorCode.RECONCILE_NO_RECOVERY
    guard: Guard | None = None
    observable: bool = False

    @property
    def counts_attempt(self) -> bool:
        """Whether carrying it out counts one of the job's attempts (a poll, an evidence
        search; the claim spaces them by ``ATTEMPT_SPACING``)."""
        return self.action in (Action.POLL, Action.EVIDENCE)



@dataclass(frozen=True)
class _Row:
    """One job as the table sees it: the row, its kind (None: unknown), the tick's time, the
    settings and the legacy cutoff (None: no row is a legacy candidate)."""

    settings: Settings
    job: Job
    kind: Kind | None
    now: datetime
    legacy_cutoff: datetime | None = None

    @property
    def provider_status(self) -> str | None:
        """The provider's raw status at the job's latest stored read (None: none stored yet)."""
        return self.job.provider_status

    def aged(self, since: datetime | None, age: timedelta) -> bool:
        return since is not None and self.now - since >= self.settings.scaled(age)

    def past_threshold(self) -> bool:
        # the kind's stale threshold since the start (jobstore.horizon, as the poll chain reads it)
        return self.kind is not None and horizon.past_threshold(self.settings, self.job,
                                                                self.kind, self.now)

    def attempt_due(self) -> bool:
        last = self.job.reconcile_last_attempt_at
        return last is None or self.aged(last, ATTEMPT_SPACING)

    def lease_expired(self) -> bool:
        if self.job.poll_due_at is not None and self.settings.poll_mode == "batch":
            # a batch-polled row is never resumed: it is due, or claimed until its batch lease
            # ends and then due again (a dead poller costs one lease, not a new chain)
            return False
        lease = self.job.poll_lease_expires_at
        return lease is None or lease <= self.now

    def fail_if_stale(self, row: str) -> Decision:
        # a call with no upstream handle: past its threshold and its call's claim (jobstore.horizon)
        stale = self.kind is not None and \
            self.now >= horizon.call_deadline(self.settings, self.job, self.kind)
        return Decision(row, Action.FAIL if stale else Action.LEAVE)


def _legacy(r: _Row) -> Decision | None:
    """1: a row nobody submitted through the library (the legacy catch-all), bounded by
    the legacy cutoff, age and job types (``adoption``; README, Design notes: Legacy rows). In ``observe`` mode
    the FAIL is only logged and counted (``reconcile.sweep.claims._observed``). A platform row
    without a task id, of a kind this process does not know, follows the same rules (issue 24
    finding 2: never failed merely by age); where they fail nothing it gets one ``unknown_kind``
    anomaly (``unknown_kind``)."""
    j = r.job
    if not adoption.is_foreign(j, r.kind):
        return None
    unknown_kind = Decision("unknown_kind", Action.ANOMALY) if j.provider_kind is not None else None
    if r.settings.legacy_sweep == "off":
        return unknown_kind or Decision("legacy_off", Action.LEAVE)
    why_not = adoption.legacy_reason(r.settings, r.legacy_cutoff, j, r.now)
    if why_not is None:
        return Decision("legacy", Action.FAIL, observable=True)
    if unknown_kind is not None:
        return unknown_kind
    if why_not == "after_cutoff":  # another subsystem's row: never touched, in any mode
        return Decision("foreign_after_cutoff", Action.LEAVE)
    return Decision("legacy", Action.LEAVE)


def _unknown_kind(r: _Row) -> Decision | None:
    """3: a kind this process does not know on a row the library submitted, or on a platform
    row with a task id: report once, touch nothing, never guess (another process may have
    registered the kind; every process should: ``REQUIRED_KINDS``). Any other platform row of an
    unknown kind is ``legacy``'s."""
    j = r.job
    if j.provider_kind is None or r.kind is not None:
        return None
    return Decision("unknown_kind", Action.ANOMALY)


def _platform_untracked(r: _Row) -> Decision | None:
    """4: a platform row with a known kind and no upstream handle: as a sync kind."""
    j = r.job
    if j.submission_state is not None or r.kind is None:
        return None
    if j.provider_task_id and not r.kind.sync:
        return None
    return r.fail_if_stale("platform_untracked")


def _platform_task(r: _Row) -> Decision | None:
    """5: a platform row with a task id: as ``accepted`` once past the threshold (a NULL poll
    lease is not expired before it: the library never starts a chain on it earlier)."""
    j = r.job
    if j.submission_state is not None or r.kind is None or not j.provider_task_id:
        return None
    if not r.past_threshold():
        return Decision("platform_task", Action.LEAVE)
    return _accepted_action(r, "platform_task")


def _not_started(r: _Row) -> Decision | None:
    """6 and 7: the create never ran (async: re-enqueue, bounded) or the sync request died."""
    j, kind = r.job, r.kind
    if j.submission_state != Submission.NOT_STARTED or kind is None:
        return None
    if kind.sync:
        stale = r.aged(j.created_at, kind.stale_threshold)
        return Decision("not_started_sync", Action.FAIL if stale else Action.LEAVE)
    due = (r.aged(j.created_at, NOT_STARTED_AGE)
           and (j.create_not_before is None or j.create_not_before <= r.now)
           and (j.create_enqueued_at is None or r.aged(j.create_enqueued_at, NOT_STARTED_AGE)))
    if not due:
        return Decision("not_started", Action.LEAVE)
    if (j.create_enqueue_count or 0) >= MAX_CREATE_REENQUEUES:
        return Decision("not_started_exhausted", Action.FAIL, guard=Guard.STILL_NOT_STARTED)
    return Decision("not_started", Action.REENQUEUE)


def _submitting(r: _Row) -> Decision | None:
    """8 and 9: a create in progress; once its lease is gone nobody knows whether it landed."""
    j, kind = r.job, r.kind
    if j.submission_state != Submission.SUBMITTING or kind is None:
        return None
    if j.claim_expires_at is not None and j.claim_expires_at > r.now:
        return Decision("submitting", Action.LEAVE)
    if not kind.sync:
        return Decision("submitting_expired", Action.MARK_UNCERTAIN)
    return r.fail_if_stale("submitting_sync_expired")  # no recovery possible: fail + refund


def _accepted(r: _Row) -> Decision | None:
    """10 and 11: an accepted task: poll once when an attempt is due, resume a dead chain."""
    j, kind = r.job, r.kind
    if j.submission_state != Submission.ACCEPTED or kind is None:
        return None
    if kind.sync:  # a sync call holds no upstream handle: nothing to poll
        return r.fail_if_stale("accepted_sync")
    if not j.provider_task_id:
        return Decision("accepted", Action.LEAVE)
    return _accepted_action(r, "accepted")


def _accepted_action(r: _Row, row: str) -> Decision:
    if r.past_threshold() and r.attempt_due():
        return Decision(row, Action.POLL, resume=r.lease_expired())
    if r.lease_expired():
        return Decision(row, Action.RESUME)
    return Decision(row, Action.LEAVE)


def _uncertain(r: _Row) -> Decision | None:
    """12: look for evidence every 5 minutes; never refunded or resubmitted automatically."""
    j, kind = r.job, r.kind
    if j.submission_state != Submission.UNCERTAIN or kind is None:
        return None
    if kind.sync:  # never made by the library today; an old stray create message did (hole 12)
        return r.fail_if_stale("uncertain_sync")
    if not r.attempt_due():
        return Decision("uncertain", Action.LEAVE)
    return Decision("uncertain", Action.EVIDENCE)


_TABLE: tuple[Callable[[_Row], Decision | None], ...] = (
    _legacy, _unknown_kind, _platform_untracked, _platform_task,
    _not_started, _submitting, _accepted, _uncertain,
)

_NO_MATCH = Decision("none", Action.LEAVE)

_ERROR = Decision("error", Action.LEAVE)


def settle_cutoff(settings: Settings, now: datetime) -> datetime:
    """The ``unsettled`` row's cutoff: a due settlement is the sweep's once it has waited :data:`SETTLE_GRACE`."""
    return now - settings.scaled(SETTLE_GRACE)


def needs_legacy_cutoff(settings: Settings, job: Job, kind: Kind | None) -> bool:
    """Whether :func:`decide` reads ``legacy_cutoff`` for this row (``legacy`` past its ``off``
    check; ``kind``: the row's registered kind, None when unknown): the caller reads the cutoff
    only then, as the table did when it held the runtime."""
    return (job.status in IN_FLIGHT and adoption.is_foreign(job, kind)
            and settings.legacy_sweep != "off")


def decide(settings: Settings, job: Job, kind: Kind | None, now: datetime, *,
           legacy_cutoff: datetime | None = None) -> Decision:
    """The decision-table action for one row: reads nothing but the row, its kind (None:
    unknown), the settings and ``legacy_cutoff`` (the adoption time, which the caller reads
    from the database once)."""
    if job.status in (Status.FAILED, Status.CANCELLED):
        due = is_settlement_due(job, settle_cutoff(settings, now))
        return Decision("unsettled", Action.SETTLE) if due else _NO_MATCH  # 13
    if job.status not in IN_FLIGHT:
        return _NO_MATCH
    row = _Row(settings, job, kind, now, legacy_cutoff)
    for check in _TABLE:
        decision = check(row)
        if decision is not None:
            return decision
    return _NO_MATCH
