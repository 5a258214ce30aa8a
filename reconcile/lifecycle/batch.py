"""Internal: the library's own mechanics, not an import path for platforms (may move).

Polling at scale (issue 16): poll-due times on the rows, read in batches.

``RECONCILE_POLL_MODE=batch`` (the default; ``chain`` is the option of one ``reconcile.poll``
message per read). In batch mode an accepted job carries ``jobs.poll_due_at`` instead of a message, and
``reconcile.poll_due`` (beat, every ``POLL_BATCH_INTERVAL`` s; it also re-enqueues itself while
rows stay due past its time budget) runs :func:`poll_due`:

1. **claim** up to ``POLL_BATCH_SIZE`` due rows in one statement on PostgreSQL —
   ``SELECT … WHERE poll_due_at <= now AND in flight ORDER BY poll_due_at LIMIT n FOR UPDATE
   SKIP LOCKED`` as the CTE of one ``UPDATE`` moving each ``poll_due_at`` one batch lease ahead
   with ``poll_seq + 1`` (:func:`reconcile.jobstore.claim_due_with_times`; SQLite: the read
   then the update, in one transaction): the claim is ``(poll_generation, poll_seq)``. Two
   pollers never claim one row; a poller that dies leaves its rows due again after one lease
   (no chain to resume);
2. **read** every claimed task's status, ``POLL_BATCH_THREADS`` at a time (a bounded thread
   pool for the HTTP reads only: no database work in those threads, the GIL is released on I/O);
   a batch larger than the pool reads in rounds, and before each round after the first the
   batch's claims are extended by one lease in one statement (:func:`run_claims`);
3. **write** the outcomes: the rows still running short of their stale threshold (no error, the
   common case) in ONE set-based ``UPDATE … FROM unnest(…)`` (next due time — one interval
   after the due time claimed, see :func:`next_due` —, progress, the provider's status), each
   row guarded by its claim; every other outcome (succeeded, failed, an error, unknown / not
   found, past the threshold) goes per job through ``lifecycle.observe`` exactly as the chain
   does, under its claim: one statement for the whole round
   (:func:`reconcile.jobstore.hold_claims_with_status`) first confirms and extends each of
   their claims and stores each read's provider status (a claim taken over is refused there),
   and each job's attempt count and failure at exhaustion then apply only while the row still
   carries its claim (``observe(claim=…)``): a claim taken over while the round's earlier jobs
   finalize spends no attempt and fails nothing on a read that was no verdict. Finalize stays
   one transaction per job,
   attempts / threshold / exhaustion are the chain's own code (``lifecycle._unfinished``).
   Those per-job outcomes of one round run concurrently, ``POLL_BATCH_FINALIZE_THREADS`` at a
   time (a bounded thread pool: the media downloads and uploads of a round's completions
   overlap); each job's claim check, CAS and ledger commit are its own transactions, so one
   job's failure never rolls back another's completion.

The loop claims again while rows are due and its time budget is left. When its first claim
comes back full, the task sends one more ``reconcile.poll_due`` (expiring as a tick does), so
an idle worker process shares the rest of the due rows. When a row falls due before the next
tick, the task sends a wake: one more ``reconcile.poll_due`` due then (:func:`wake_in`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Literal

from .. import jobstore, lifecycle
from ..db.models import Job
from ..db.session import one_statement
from ..errors import ErrorCode, ProviderError
from ..kinds import Kind
from ..providers.base import PollResult, PollStatus
from ..runtime import Runtime
from ..settings import Settings
from ..states import POLL_LEASE_SLACK
from .batch_reads import finalize_pool, read_all, release_finalize, reserve_finalize
from .create import _async_kinds
from .poll import (  # batch mode's due times: the chain and the create use them too
    first_due as first_due,
    next_due,
    reschedule_after_chain as reschedule_after_chain,
)

log = logging.getLogger("reconcile.batch_poll")

# the outcomes of a read that need nothing but a new due time (and progress), short of the
# stale threshold: the set-based path
_RUNNING = (PollStatus.RUNNING,)


def enabled(rt: Runtime) -> bool:
    return rt.settings.poll_mode == "batch"


def stalled(rt: Runtime, now: datetime | None = None) -> datetime | None:
    """The oldest due time of a row this process could claim that has been due for more than
    two poll_due ticks and is still unclaimed (None: no such row): the ticks are not arriving
    (beat down, late or not running), or every poller is busy. The worker's fallback tick
    (:mod:`reconcile.worker.ticker`) sends one ``reconcile.poll_due`` then."""
    every, _ = rt.settings.poll_due_tick
    before = (now or rt.now()) - timedelta(seconds=2 * every)
    with rt.sessions.begin() as session:
        return jobstore.oldest_unclaimed_due(session, before, kinds=_async_kinds())


def claim_lease(rt: Runtime) -> timedelta:
    """How long a claim holds its rows (:func:`claim_lease_of` the runtime's settings)."""
    return claim_lease_of(rt.settings)


def claim_lease_of(settings: Settings) -> timedelta:
    """How long a claim holds its rows under ``settings``: one status read's total deadline +
    the poll slack (scaled). A dead poller's rows are due again after this."""
    return settings.scaled(lifecycle.poll_step_deadline(settings) + POLL_LEASE_SLACK)


# ----------------------------------------------------------------------------- one run


@dataclass
class BatchReport:
    claimed: int = 0
    running: int = 0  # written by the set-based statement
    observed: int = 0  # went per job through lifecycle.observe
    fenced: int = 0  # the claim was taken over before the result was written: refused
    batches: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    more: bool = False  # the time budget ran out with rows still due

    def add(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def line(self) -> str:
        outcomes = ",".join(f"{k}={v}" for k, v in sorted(self.outcomes.items()))
        return (f"[reconcile] poll_due batches={self.batches} claimed={self.claimed} "
                f"running={self.running} observed={self.observed} fenced={self.fenced}"
                f"{' ' + outcomes if outcomes else ''}{' more' if self.more else ''}")


@dataclass(frozen=True)
class Claim:
    job: Job
    kind: Kind | None
    generation: int
    seq: int
    was_due: datetime | None = None  # the row's due time before the claim (next_due's anchor)


def claim(rt: Runtime, *, limit: int | None = None, now: datetime | None = None) -> list[Claim]:
    """Claim up to ``limit`` due rows (one transaction; see the module docstring)."""
    now = now or rt.now()
    limit = limit or rt.settings.poll_batch_size
    with one_statement(rt.sessions) as session:
        # only the kinds this process can read: a row of a kind it does not know (unregistered
        # here, or known only to another deployment's workers) stays due for a poller that
        # does, instead of being claimed and dropped every lease; the sweep reports it
        # (``unknown_kind``) when no process knows it
        rows = jobstore.claim_due_with_times(session, now, claim_lease(rt), limit,
                                             kinds=_async_kinds(), worker=rt.worker_id)
    return [Claim(job, rt.kind(job.provider_kind), job.poll_generation, job.poll_seq, was_due)
            for job, was_due in rows]


def poll_due(rt: Runtime, *, budget: float | None = None, limit: int | None = None,
             helper: Callable[[], None] | None = None) -> BatchReport:
    """Claim, read and write batches while rows are due and ``budget`` (seconds of real time;
    default ``POLL_BATCH_TIME_BUDGET`` scaled) is left.

    ``helper``: called once, when the run's first claim comes back full (more rows may be due
    than one batch): the Celery task sends another ``poll_due`` there, so that an idle worker
    process claims the next batch while this one reads and finalizes its own (a burst of
    completions is finalized on every process, not on the one that drew the tick)."""
    report = BatchReport()
    if budget is None:
        budget = rt.settings.poll_batch_time_budget * rt.settings.time_scale
    deadline = time.monotonic() + budget
    limit = limit or rt.settings.poll_batch_size
    while True:
        claims = claim(rt, limit=limit)
        if not claims:
            break
        if helper is not None and not report.batches and len(claims) >= limit:
            try:
                helper()
            except Exception:  # the help is an optimisation: the claimed rows go on
                log.warning("poll_due_helper_not_sent", exc_info=True)
        report.batches += 1
        report.claimed += len(claims)
        run_claims(rt, claims, report)
        if len(claims) < limit:
            break  # nothing more was due at the claim: the next tick picks up what falls due
        if time.monotonic() >= deadline:
            report.more = True
            break
    if report.claimed:
        log.info(report.line())
    return report


# a wake comes at least this share of a tick after the run that sent it: at most
# WAKES_PER_TICK - 1 wakes follow a tick, however densely rows fall due
WAKES_PER_TICK = 4


def wake_in(rt: Runtime, until: datetime) -> float | None:
    """When a ``poll_due`` run should wake again before ``until`` (the next beat tick): seconds
    from now to the earliest due time of an unclaimed row this process could claim, or to one
    ``1/WAKES_PER_TICK`` of a tick from now if that is later (a row due already: then); None
    when no row falls due before ``until`` (the tick claims it) or the wake would come at or
    after it.

    Rows are claimed only when a run comes; a run each tick made every read wait for the tick,
    up to one tick (0.5 s on average at the default 1 s) past its due time. A wake is the same
    claim sent to arrive when the next row falls due: idle (nothing due before the next tick)
    it costs this one indexed read per run, and at most ``WAKES_PER_TICK - 1`` runs follow a
    tick."""
    now = rt.now()
    with rt.sessions() as session:  # a row due already (it fell due during the run) counts
        upcoming = jobstore.oldest_unclaimed_due(session, until, kinds=_async_kinds())
    if upcoming is None or upcoming >= until:
        return None
    every, _ = rt.settings.poll_due_tick
    at = max(upcoming, now + timedelta(seconds=every / WAKES_PER_TICK))
    return (at - now).total_seconds() if at < until else None


def run_claims(rt: Runtime, claims: list[Claim], report: BatchReport | None = None) -> BatchReport:
    """Read every claim's status, then write the outcomes (the module docstring's 2 and 3).

    A claim's lease covers one read (see :func:`claim_lease`); a batch larger than the thread
    count reads in rounds of ``POLL_BATCH_THREADS``, so before each round after the first every
    claim of the batch is extended by one lease in one statement
    (:func:`reconcile.jobstore.hold_claims`), and a claim taken over meanwhile is dropped
    (fenced: its result is not written). A live poller keeps its rows however many rounds it
    needs; a dead one's rows are due again one lease after its last extension."""
    report = report if report is not None else BatchReport()
    rt.crash_point("mid_batch")  # claimed (committed), nothing read yet
    claims, results = _read_rounds(rt, claims, report)
    _write(rt, claims, results, report)
    return report


def _read_rounds(rt: Runtime, claims: list[Claim], report: BatchReport
                 ) -> tuple[list[Claim], list[Any]]:
    size = max(1, rt.settings.poll_batch_threads)
    kept: list[Claim] = list(claims)
    results: list[Any] = []
    while len(results) < len(kept):
        if results:
            with one_statement(rt.sessions) as session:
                held = jobstore.hold_claims(session, [(c.job.id, c.generation, c.seq)
                                                      for c in kept], rt.now() + claim_lease(rt))
            still = [n for n, c in enumerate(kept) if c.job.id in held]
            report.fenced += len(kept) - len(still)
            results = [results[n] for n in still if n < len(results)]
            kept = [kept[n] for n in still]
        results += read_all(rt, kept[len(results):len(results) + size])
    return kept, results


def _write(rt: Runtime, claims: list[Claim], results: list[Any], report: BatchReport) -> None:
    now = rt.now()
    running: list[jobstore.Rescheduled] = []
    others: list[tuple[Claim, PollResult | ProviderError | BaseException]] = []
    for c, result in zip(claims, results, strict=True):
        if c.kind is None or c.kind.sync:
            report.add("lost")
            continue
        if isinstance(result, PollResult) and result.status in _RUNNING \
                and not lifecycle.past_threshold(rt, c.job, c.kind, now):
            try:
                progress = (max(0, min(99, int(result.progress)))
                            if result.progress is not None else None)
            except (TypeError, ValueError, OverflowError) as exc:
                # a progress that is no number ("50%", NaN): an error for this row only, as
                # observe makes it on the chain path — never an exception out of the batch
                others.append((c, exc))
                continue
            running.append((c.job.id, c.generation, c.seq,
                            next_due(rt, c.kind, c.job, now, c.was_due), progress,
                            result.raw_status))
        else:
            others.append((c, result))
    if running:
        _reschedule_running(rt, running, report)
    if not others:
        return
    pooled = min(rt.settings.poll_batch_finalize_threads, len(others)) > 1
    outputs = [lifecycle.outputs_to_store(rt.settings, result) for _, result in others]
    bounds = [_bound(rt, n) for n in outputs]
    total = sum(bounds, timedelta(0))
    # on the process's finalize pool, the round queues behind what other rounds (a threads
    # worker runs several) queued before it: reserved first, so each round's holds count it
    queued = reserve_finalize(total) if pooled else timedelta(0)
    try:
        holds = _hold_all(rt, others, outputs, bounds, queued,
                          rt.settings.poll_batch_finalize_threads if pooled else 1)
        items = [(c, result, _HOLD_EACH if holds is None else holds.get(c.job.id))
                 for c, result in others]
        if not pooled:
            for c, result, held in items:
                report.add(_isolated(rt, c, result, report, held))
            return
        # concurrently: each job in its own thread with its own report, merged here
        pool = finalize_pool(rt.settings.poll_batch_finalize_threads)
        for outcome, part in pool.map(lambda item: _alone(rt, *item), items):
            report.add(outcome)
            report.observed += part.observed
            report.fenced += part.fenced
    finally:
        if pooled:
            release_finalize(total)


def _reschedule_running(rt: Runtime, running: list[jobstore.Rescheduled],
                        report: BatchReport) -> None:
    """The round's still-running rows in ONE set-based write; when that statement fails (one
    row's value the platform's column refuses, a trigger…), each row is written alone, so the
    failure stays that row's (it stays claimed: due again after its lease) and the rest of the
    round — its other rows, its completions — goes on."""
    try:
        with one_statement(rt.sessions) as session:
            won, failed = jobstore.reschedule_claimed(session, running), 0
    except Exception:
        log.warning("batch_reschedule_failed rows=%d: each row is written alone", len(running),
                    exc_info=True)
        won = failed = 0
        for row in running:
            try:
                with one_statement(rt.sessions) as session:
                    won += jobstore.reschedule_claimed(session, [row])
            except Exception:
                log.exception("batch_row_failed job_id=%s", row[0])
                failed += 1
    report.running += won
    report.fenced += len(running) - won - failed
    report.outcomes["in_flight"] = report.outcomes.get("in_flight", 0) + won
    if failed:
        report.outcomes["error"] = report.outcomes.get("error", 0) + failed


class _Hold(Enum):
    EACH = "each"  # a claim the round did not hold: the job holds its own (one CAS) first


_HOLD_EACH = _Hold.EACH
# what a job's outcome is handed: the row the round's hold returned, None (that hold found the
# claim taken over), or _HOLD_EACH
Held = Job | None | Literal[_Hold.EACH]


def _hold_all(rt: Runtime, others: list[tuple[Claim, Any]], outputs: list[int],
              bounds: list[timedelta], queued: timedelta,
              threads: int) -> dict[uuid.UUID, Job] | None:
    """Before the round's per-job outcomes: ONE statement confirms and extends each of their
    claims (a success whose outputs are to be stored: until its storing may have ended, with
    its storing mark: :func:`_holds` — so its completion needs no statement of its own) and
    stores the status each read saw (:func:`reconcile.jobstore.hold_claims_with_status`,
    every row its own compare-and-set). Returns the rows held by id (a claim taken over is
    absent: fenced). None when that statement failed: each job then holds its own claim, so a
    database error on one row stays that row's (a group that did commit is held again under
    the same claim: nothing changes). The claim is still checked at each job's writes: its
    outcome is observed under it (``lifecycle.observe(claim=…)``), so a claim taken over while
    the round's earlier jobs finalize spends no attempt and fails nothing."""
    rows = [(c.job.id, c.generation, c.seq,
             result.raw_status if isinstance(result, PollResult) else None)
            for c, result in others]
    try:
        now = rt.now()
        untils, storing = _holds(rt, now, others, outputs, bounds, queued, threads)
        with one_statement(rt.sessions) as session:
            return jobstore.hold_claims_with_status(session, rows, untils, storing=storing,
                                                    now=now)
    except Exception:
        log.warning("batch_hold_failed rows=%d: each row holds its own claim", len(rows),
                    exc_info=True)
        return None


def _bound(rt: Runtime, outputs: int) -> timedelta:
    """How long one outcome of a round may take on the finalize pool: a success with
    ``outputs`` to store (``lifecycle.outputs_to_store``), its ``storing_hold``; any other
    outcome (database work only), the slack."""
    return lifecycle.storing_hold(rt.settings, outputs) if outputs \
        else rt.settings.scaled(POLL_LEASE_SLACK)


def _holds(rt: Runtime, now: datetime, others: list[tuple[Claim, Any]], outputs: list[int],
           bounds: list[timedelta], queued: timedelta,
           threads: int) -> tuple[list[datetime], set[uuid.UUID]]:
    """Each outcome's hold in the round's grouped hold, in order, and the ids whose hold is a
    storing mark. A row holds one claim lease; a success to be stored holds until its storing
    may have ended: the outcomes run on ``threads`` threads (the process's finalize pool, or
    this one) in this order, behind ``queued`` (what other rounds queued there first), so the i-th
    starts at the latest once the threads have worked off everything before it (the sum of
    its bounds ÷ the threads: each thread was busy until then), and takes at most its own
    bound (:func:`_bound`)."""
    lease = claim_lease(rt)
    untils: list[datetime] = []
    storing: set[uuid.UUID] = set()
    ahead = queued
    for (c, _), stored, own in zip(others, outputs, bounds, strict=True):
        if stored:
            untils.append(now + max(lease, ahead / threads + own))
            storing.add(c.job.id)
        else:
            untils.append(now + lease)
        ahead += own
    return untils, storing


def _alone(rt: Runtime, c: Claim, result: Any, held: Held) -> tuple[str, BatchReport]:
    part = BatchReport()
    return _isolated(rt, c, result, part, held), part


def _isolated(rt: Runtime, c: Claim, result: Any, report: BatchReport,
              held: Held = _HOLD_EACH) -> str:
    try:
        return _one(rt, c, result, report, held)
    except Exception:  # one row's failure (a database error…) never stops the others
        log.exception("batch_row_failed job_id=%s", c.job.id)
        return "error"  # still claimed: due again after its lease, as a dead poller's


def _one(rt: Runtime, c: Claim, result: PollResult | ProviderError | BaseException,
         report: BatchReport, held: Held = _HOLD_EACH) -> str:
    """A result that is not plain "still running": per job, through the chain's own code,
    under the claim. ``held``: the row as the round's hold returned it (None: that hold found
    the claim taken over); by default the job holds its own claim first."""
    assert c.kind is not None
    grouped = held is not _HOLD_EACH
    if held is _HOLD_EACH:
        status = result.raw_status if isinstance(result, PollResult) else None
        # the claim holds: the read's status stored with it
        with one_statement(rt.sessions) as session:
            held = jobstore.hold_claim(session, c.job.id, c.generation, c.seq,
                                       rt.now() + claim_lease(rt), status=status)
    if held is None:
        report.fenced += 1
        return "fenced"
    report.observed += 1
    claim = (c.generation, c.seq)
    if isinstance(result, PollResult | ProviderError):
        # the storing mark the round's grouped hold set for a success (:func:`_holds`), which
        # counted it as a storer
        marked = held.storing_until \
            if grouped and lifecycle.outputs_to_store(rt.settings, result) else None
        outcome = lifecycle.observe(rt, held, c.kind, via="poll", result=result, claim=claim,
                                    marked=marked)
    else:  # the read raised something else: no verdict, an attempt as observe counts one
        log.error("batch_read_raised job_id=%s", c.job.id, exc_info=result)
        outcome = lifecycle._unfinished(
            rt, held, c.kind, None,
            f"{ErrorCode.INTERNAL}: {type(result).__name__}: {result}"[:1000],
            raised=ErrorCode.INTERNAL, fence=jobstore.under_claim(*claim))
        outcome = "error" if outcome == "in_flight" else outcome
    if outcome in ("in_flight", "error"):
        with one_statement(rt.sessions) as session:
            if not jobstore.reschedule_claimed(
                    session, [(c.job.id, c.generation, c.seq,
                               next_due(rt, c.kind, held, rt.now(), c.was_due), None)]):
                report.fenced += 1
                return "fenced"  # taken over: what it read counted for nothing
    return outcome


# ----------------------------------------------------------------------------- hooks


def make_due(rt: Runtime, job_id: uuid.UUID) -> bool:
    """A row with no due time in batch mode (a dead chain, a row from before the switch):
    a new generation, due now. False: it is scheduled already (or finished)."""
    now = rt.now()
    with rt.sessions.begin() as session:
        return jobstore.make_due(session, job_id, now, claim_lease(rt)) is not None
