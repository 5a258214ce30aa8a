"""Internal: poll — the poll leases and countdowns (and batch mode's due times: the batch poller,
a create and a chain message in batch mode use them), the chain's turn, one status read and what
is done with it (observe), unfinished attempts and exhaustion.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import Row

from .. import jobstore
from ..db.models import Job
from ..errors import (
    ErrorCode,
    MediaError,
    MediaExpired,
    MediaTooLarge,
    ProviderError,
    ReconcileError,
    UnsafeMediaURL,
)
from ..jobstore import horizon
from ..kinds import Kind, all_kinds
from ..providers.base import PollResult, PollStatus
from ..runtime import Runtime
from ..settings import Settings
from ..states import (
    ATTEMPT_SPACING,
    IN_FLIGHT,
    POLL_LEASE_SLACK,
    POLL_READ_ATTEMPTS,
    POLL_READ_BACKOFF_MAX,
)
from .finalize import finalize_job_with_media
from .settling import fail_job

log = logging.getLogger("reconcile.lifecycle")


def poll_lease(rt: Runtime, kind: Kind, age: timedelta = timedelta(0)) -> timedelta:
    """2 × interval + slack (scaled like every duration): what a live chain must beat between
    two turns, and how long a dead one waits for the sweep (issue 16, bench figure 6).

    It does not cover :func:`poll_step_deadline`: a status read slower than the slack loses the
    lease, and the sweep may start a new generation beside it — safe (the slow chain is fenced
    at its next turn; its answer goes through the same CAS paths), a duplicate read at worst."""
    return _lease_for(rt, kind.interval_at(age))


def _lease_for(rt: Runtime, interval: timedelta) -> timedelta:
    return rt.settings.scaled(interval * 2 + POLL_LEASE_SLACK)


def _turn_leases(rt: Runtime) -> dict[str, list[tuple[timedelta | None, timedelta]]]:
    """Every registered kind's ``poll_lease(rt, kind, age)`` by age (``Kind.interval_steps``):
    the poll turn picks its row's in SQL, so it needs no load before it. Worked out once per
    registry and time scale (kinds are frozen: a changed kind is a new object)."""
    kinds = all_kinds()
    key = (tuple(map(id, kinds)), rt.settings.time_scale)
    cached = _TURN_LEASES.get(key)
    if cached is None:
        leases = {kind.name: [(after, _lease_for(rt, interval))
                              for after, interval in kind.interval_steps()] for kind in kinds}
        if len(_TURN_LEASES) > 32:
            _TURN_LEASES.clear()
        # the kinds stay referenced by the entry, so their ids cannot be reused while it lives
        cached = _TURN_LEASES[key] = (kinds, leases)
    return cached[1]


_TURN_LEASES: dict[tuple[tuple[int, ...], Any], tuple[Any, dict[str, list[tuple[timedelta | None, timedelta]]]]] = {}


def poll_step_deadline(settings: Any) -> timedelta:
    """The longest one status read can take: every attempt to its total deadline (connect +
    read timeout) plus the capped backoff between attempts (``states.POLL_READ_*``)."""
    per_request = timedelta(seconds=settings.connect_timeout + settings.read_timeout)
    return per_request * POLL_READ_ATTEMPTS + POLL_READ_BACKOFF_MAX * (POLL_READ_ATTEMPTS - 1)


def storing_hold(settings: Settings, outputs: int) -> timedelta:
    """How long storing ``outputs`` outputs of a success may take: each one's fetch
    (``media_timeout``: the whole exchange) and its upload (assumed no longer), plus the poll
    slack; scaled like every duration (as :func:`~reconcile.lifecycle.batch.claim_lease_of`
    scales a status read's deadlines). Whoever read "succeeded" marks the row for this long
    before it stores them (:func:`_mark_storing`): until then no read that is no verdict fails
    the job at its exhaustion horizon (:func:`exhaust`). A turn's lease or a batch claim is
    sized for a status read, not for this: a storing that outlasted it looked like nobody's, and
    a stale "not found" read meanwhile failed and refunded the job whose task had succeeded."""
    per_output = timedelta(seconds=settings.media_timeout) * 2
    return settings.scaled(per_output * outputs + POLL_LEASE_SLACK)


def outputs_to_store(settings: Settings, result: object) -> int:
    """The outputs a read's success will have stored (0: none — not a success, no outputs, or
    more than ``max_outputs_per_job``: those fail, :func:`observe`)."""
    if isinstance(result, PollResult) and result.status is PollStatus.SUCCEEDED \
            and 0 < len(result.outputs) <= settings.max_outputs_per_job:
        return len(result.outputs)
    return 0


def _mark_storing(rt: Runtime, job: Job, holder: tuple[int, int] | None, outputs: int,
                  marked: datetime | None) -> bool:
    """Before the outputs of a success are stored: the row's storing mark moves to ``now +
    storing_hold`` and the storer is counted (:func:`jobstore.hold_while_storing`); a poller
    (``holder``: its own turn or claim) moves its hold there too. ``marked``: the mark a batch
    round's grouped hold set for this success, which counted it; kept (no statement) while it
    ends no earlier than ``now + storing_hold − slack`` (a completion that waited less than the
    slack in the round's queue), else only moved. Returns whether the storer is counted (its
    failed storing takes the count back)."""
    now = rt.now()
    need = storing_hold(rt.settings, outputs)
    if marked is not None and marked >= now + need - rt.settings.scaled(POLL_LEASE_SLACK):
        return True
    with rt.sessions.begin() as session:
        counted = jobstore.hold_while_storing(session, job.id, now + need, claim=holder,
                                              now=now, counted=marked is not None)
    return counted or marked is not None


def _store(rt: Runtime, job: Job, result: PollResult, via: str,
           holder: tuple[int, int] | None, marked: datetime | None) -> bool:
    """Mark the row and count the storer (:func:`_mark_storing`), then store the outputs and
    complete the job (:func:`finalize_job_with_media`). A storing that raised takes its count
    back, so the failure at the horizon may go ahead once no other storer is counted."""
    counted = _mark_storing(rt, job, holder, outputs_to_store(rt.settings, result), marked)
    try:
        return finalize_job_with_media(rt, job.id, result, source=via, job=job)
    except Exception:
        if counted:
            with rt.sessions.begin() as session:
                jobstore.end_storing(session, job.id)
        raise


def poll_countdown(rt: Runtime, kind: Kind, job: Job | Row[Any], now: datetime) -> float:
    """Seconds to the job's next read: the kind's interval at the job's age (from the call's
    start; ``job`` needs only ``provider_call_started_at``)."""
    started = job.provider_call_started_at or now
    return rt.settings.scaled(kind.interval_at(now - started)).total_seconds()


def _batch_mode(rt: Runtime) -> bool:
    return rt.settings.poll_mode == "batch"


def next_due(rt: Runtime, kind: Kind, job: Job, now: datetime,
             was_due: datetime | None = None) -> datetime:
    """When the next read is due: the kind's interval at the job's age (the chain's countdown).

    With ``was_due`` (the due time the read was claimed at) the next read is due one interval
    after THAT, not after the read ended: rows are claimed only at ticks, so a read starts up to
    one tick (+ the claim and read time) after its due time, and counting the interval from the
    read's end added that wait to every turn — measured, figure 3: reads 6.0 s apart on a 5-s
    kind with the 1-s tick, the completion seen 5.7 s late at p50. It is never earlier than one
    tick (at most half an interval) short of the interval after the read's end, so a poller
    that fell behind does not catch up in a burst: the next read comes at most one tick sooner
    than the chain's would."""
    interval = timedelta(seconds=poll_countdown(rt, kind, job, now))
    after_read = now + interval
    if was_due is None:
        return after_read
    tick = min(rt.settings.scaled(timedelta(seconds=rt.settings.poll_batch_interval)),
               interval / 2)
    return max(was_due + interval, after_read - tick)


def first_due(rt: Runtime, kind: Kind, now: datetime) -> datetime:
    return now + rt.settings.scaled(kind.interval_at(timedelta(0)))


def reschedule_after_chain(rt: Runtime, kind: Kind, job: Job, generation: int, seq: int, *,
                           status: str | None = None) -> bool:
    """A chain message that ran in batch mode (sent before the switch): its next read is a due
    time on the row, under the turn it just took, instead of another message; ``status``: the
    provider's status its read saw, stored with it."""
    with rt.sessions.begin() as session:
        return bool(jobstore.reschedule_claimed(
            session, [(job.id, generation, seq, next_due(rt, kind, job, rt.now()), None,
                       status)]))


def resume_chain(rt: Runtime, job_id: uuid.UUID, *, only_if_lease_expired: bool = False) -> bool:
    """Start a new poll chain for an accepted job: a new generation, or the same one when it
    never took a turn (its first turn sent again; ``jobstore.start_new_chain``)."""
    now = rt.now()
    with rt.sessions.begin() as session:
        job = jobstore.load(session, job_id)
        kind = rt.kind(job.provider_kind) if job else None
        if job is None or kind is None or kind.sync or job.status not in IN_FLIGHT:
            return False
        batch = _batch_mode(rt)
        if only_if_lease_expired and batch and job.poll_due_at is not None:
            return False  # scheduled: due (or claimed until its lease ends) — nothing to resume
        if only_if_lease_expired and job.poll_lease_expires_at and job.poll_lease_expires_at > now:
            return False
        # batch mode: the new generation is due now (a claim in progress is fenced), no message
        fresh = jobstore.start_new_chain(session, job_id, now, poll_lease(rt, kind),
                                         poll_due_at=now if batch else None)
    if fresh is None:
        return False
    log.info("poll_chain_resumed job_id=%s generation=%s batch=%s", job_id,
             fresh.poll_generation, batch)
    if not batch:
        rt.enqueue_poll(job_id, fresh.poll_generation, 0, 0.0)
    return True


def poll_step(rt: Runtime, job_id: uuid.UUID, generation: int, seq: int,
              status: str | None = None) -> str:
    """One status read for one job; reschedules itself while the job is in flight.

    The turn is the step's load: one ``UPDATE … RETURNING`` whose lease is the row's
    ``poll_lease(kind, age)`` picked in SQL. Only a lost turn reads the row (``lost``: no such
    job or an unknown kind; else ``fenced``). ``status``: the provider's status the chain's
    previous read saw (its message carries it), which the turn stores on the row; this read's
    status goes on with the next message (README, The provider's last status).
    """
    now = rt.now()
    with rt.sessions.begin() as session:
        turn = jobstore.take_poll_turn(session, job_id, generation, seq, _turn_leases(rt),
                                       now=now, worker=rt.worker_id, status=status)
    kind = rt.kind(turn.provider_kind) if turn is not None else None
    if turn is None or kind is None:
        with rt.sessions() as session:
            job = jobstore.load(session, job_id)
        return "fenced" if job is not None and rt.kind(job.provider_kind) is not None else "lost"
    rt.crash_point("mid_poll")
    outcome, seen = _read_and_observe(rt, turn, kind)
    if outcome in ("in_flight", "error"):
        if _batch_mode(rt):  # a chain message from before the switch: the row carries on due
            reschedule_after_chain(rt, kind, turn, generation, seq + 1, status=seen)
        else:
            _enqueue_next(rt, job_id, generation, seq + 1,
                         poll_countdown(rt, kind, turn, rt.now()), seen)
    return outcome


def _enqueue_next(rt: Runtime, job_id: uuid.UUID, generation: int, seq: int, countdown: float,
                 status: str | None) -> None:
    """Send the chain's next turn, carrying ``status`` (bounded) where the runtime's
    ``enqueue_poll`` takes a ``status`` keyword; one that does not (a platform's or a test's
    four-argument callable) gets the four arguments, and the status is not carried."""
    if status is not None and _takes_status(rt.enqueue_poll):
        rt.enqueue_poll(job_id, generation, seq, countdown, status=status)
    else:
        rt.enqueue_poll(job_id, generation, seq, countdown)


def _takes_status(enqueue: Any) -> bool:
    try:
        return _has_status(enqueue)
    except TypeError:  # an unhashable callable: its signature is read each time
        return _has_status.__wrapped__(enqueue)


@lru_cache(maxsize=64)
def _has_status(enqueue: Any) -> bool:
    try:
        return "status" in inspect.signature(enqueue).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin, a C callable)
        return False


def _read_and_observe(rt: Runtime, job: Job, kind: Kind) -> tuple[str, str | None]:
    """:func:`observe` of one read, and that read's provider status as it is stored (None: the
    read failed or gave none)."""
    claim = (job.poll_generation, job.poll_seq)  # the turn this step took
    try:
        result = read_status(rt, job, kind)
    except Exception as exc:  # a raising client: no verdict, as observe counts it
        return _raised(rt, job, kind, exc, via="poll", fence=jobstore.under_claim(*claim)), None
    seen = jobstore.stored_status(result.raw_status) if isinstance(result, PollResult) else None
    return observe(rt, job, kind, via="poll", result=result, claim=claim), seen


def read_status(rt: Runtime, job: Job, kind: Kind) -> PollResult | ProviderError:
    client = rt.client(kind)
    try:
        return client.poll(job.provider_task_id or "", model=job.provider_model)  # type: ignore[union-attr]
    except ProviderError as exc:
        return exc


def observe(rt: Runtime, job: Job, kind: Kind, *, via: str,
            result: PollResult | ProviderError | None = None,
            claim: tuple[int, int] | jobstore.ReaderClaim | None = None,
            marked: datetime | None = None) -> str:
    """Read the task once (unless ``result`` is given) and act on it through the CAS paths.

    Returns ``completed``, ``failed``, ``in_flight``, ``lost`` (someone else finished it) or
    ``error``. Whatever a step raises (a read, a finalize sub-step, a platform hook, the
    ledger's commit) is no verdict about the task: it counts as an attempt with its code in
    ``reconcile_last_error`` (issue 11 hole 2), so no job outlives its exhaustion horizon;
    ``error`` means the job is still in flight after such a raise (the chain goes on).

    ``claim``: the poller's ``(poll_generation, poll_seq)`` the read was made under (the chain's
    turn, the batch poller's claim), or a reader's without a turn of its own
    (:func:`reader_claim`: the sweep, a webhook's confirming read), which also counts nothing
    and fails nothing while a poller holds the row (it may be storing the success it read).
    An attempt is then counted, and a job failed at exhaustion, only while the row still
    carries it: a read that is no verdict ("not found",
    an unknown status, an error), made under a claim taken over since, never spends the new
    poller's attempts nor fails a job whose task may have finished meanwhile. A verdict the
    provider gave (succeeded, failed) is written whoever reads it: the status CAS decides.

    ``marked``: the storing mark a batch round's grouped hold set for this read's success (the
    storer counted with it); otherwise a success marks the row itself before its storing.
    """
    fence = () if claim is None else jobstore.under_claim(*claim)
    # a poller's own turn or claim (a reader's claim has four parts): it holds the row while it
    # stores a success
    holder = (claim[0], claim[1]) if claim is not None and len(claim) == 2 else None
    try:
        return _observe(rt, job, kind, via=via, result=result, fence=fence, holder=holder,
                        marked=marked)
    except Exception as exc:
        return _raised(rt, job, kind, exc, via=via, fence=fence)


def reader_claim(rt: Runtime, job: Job, *, resumed: bool = False) -> jobstore.ReaderClaim:
    """The claim a reader without a turn of its own reads under (:func:`jobstore.claim_of`): it
    counts an attempt and exhausts the job only while the row is as it loaded it, and while no
    poller holds the row (that poller may be storing the success it read; it exhausts the job
    in its own turn). Not the second: when the reader resumed the polling itself
    (``resumed``: the sweep's resume of a dead chain, no poller held it), or when the row's
    counted attempts (``job.reconcile_attempts``: the sweep's own attempt is counted by its
    claim; a webhook's is not, its count may still be refused by the spacing) are beyond the
    last one: a holder has had a whole spacing since the last attempt, and one that crashes in
    a loop never finishes."""
    beyond = horizon.beyond_last_attempt(job.reconcile_attempts or 0)
    return jobstore.claim_of(job, unheld_at=None if resumed or beyond else rt.now())


def _raised(rt: Runtime, job: Job, kind: Kind, exc: Exception, *, via: str,
            fence: tuple[Any, ...] = ()) -> str:
    """A step that raised: an attempt with the exception's code, as :func:`observe` counts it."""
    log.exception("observe_step_failed job_id=%s via=%s", job.id, via, exc_info=exc)
    code = exc.code if isinstance(exc, ReconcileError) else ErrorCode.INTERNAL
    outcome = _unfinished(rt, job, kind, None, f"{code}: {type(exc).__name__}: {exc}"[:1000],
                          raised=str(code), fence=fence)
    return "error" if outcome == "in_flight" else outcome


def _observe(rt: Runtime, job: Job, kind: Kind, *, via: str,
             result: PollResult | ProviderError | None, fence: tuple[Any, ...] = (),
             holder: tuple[int, int] | None = None,
             marked: datetime | None = None) -> str:
    if result is None:
        result = read_status(rt, job, kind)
    if isinstance(result, ProviderError):
        # a failed read is no verdict: at exhaustion it counts as "still running" (TIMEOUT)
        return _unfinished(rt, job, kind, None, f"read failed: {result.message}", fence=fence)
    if result.status is PollStatus.SUCCEEDED:
        if not result.outputs:
            ok = fail_job(rt, job.id, ErrorCode.UPSTREAM_EMPTY_RESULT,
                          "The provider reported success but returned no media.",
                          _poll_detail(result, via))
            return "failed" if ok else "lost"
        limit = rt.settings.max_outputs_per_job
        if len(result.outputs) > limit:  # bounded before any download (a DoS otherwise)
            ok = fail_job(rt, job.id, ErrorCode.UPSTREAM_OUTPUT_LIMIT,
                          f"The provider returned more than {limit} outputs.",
                          {**_poll_detail(result, via), "outputs": len(result.outputs)})
            return "failed" if ok else "lost"
        try:
            ok = _store(rt, job, result, via, holder, marked)
        except MediaExpired as exc:
            return _unfinished(rt, job, kind, ErrorCode.UPSTREAM_MEDIA_EXPIRED, exc.message,
                               fence=fence)
        except (UnsafeMediaURL, MediaTooLarge) as exc:
            # refused, not failed: kept in flight (an operator may fix the allow-list) and, at
            # exhaustion, failed UPSTREAM_FAILED with the reason rather than as a timeout
            return _unfinished(rt, job, kind, ErrorCode.UPSTREAM_FAILED,
                               f"media refused: {exc.message}", fence=fence)
        except MediaError as exc:
            return _unfinished(rt, job, kind, None, f"media fetch failed: {exc.message}",
                               fence=fence)
        return "completed" if ok else "lost"
    if result.status in (PollStatus.FAILED, PollStatus.CANCELED):
        message = result.error_message or f"The provider reported {result.raw_status or 'failure'}."
        ok = fail_job(rt, job.id, ErrorCode.UPSTREAM_FAILED, message, _poll_detail(result, via))
        return "failed" if ok else "lost"
    if result.status is PollStatus.UNKNOWN:
        return _unfinished(rt, job, kind, ErrorCode.UPSTREAM_UNKNOWN_STATUS,
                           f"unknown status {result.raw_status!r}", fence=fence)
    if result.status is PollStatus.NOT_FOUND:
        return _unfinished(rt, job, kind, ErrorCode.UPSTREAM_TASK_NOT_FOUND,
                           "task not found upstream", fence=fence)
    if result.progress is not None:
        progress = max(0, min(99, int(result.progress)))
        if job.progress is None or progress > job.progress:  # else the CAS could only lose
            with rt.sessions.begin() as session:
                jobstore.set_progress(session, job.id, progress)
    return _unfinished(rt, job, kind, None, None, fence=fence)


def _poll_detail(result: PollResult, via: str) -> dict[str, Any]:
    detail: dict[str, Any] = {"via": via}
    if result.error_code is not None:
        detail["provider_code"] = result.error_code
    if result.error_message is not None:
        detail["provider_message"] = result.error_message
    if result.raw_status is not None:
        detail["raw_status"] = result.raw_status
    if result.request_id is not None:
        detail["upstreamRequestId"] = result.request_id
    return detail


def past_threshold(rt: Runtime, job: Job, kind: Kind, now: datetime) -> bool:
    return horizon.past_threshold(rt.settings, job, kind, now)


def _unfinished(rt: Runtime, job: Job, kind: Kind, code: str | None, message: str | None, *,
                raised: str | None = None, fence: tuple[Any, ...] = ()) -> str:
    """Still not finished: note the error; past the threshold, count an attempt; at
    MAX_ATTEMPTS fail the job with the last error's code (or UPSTREAM_TIMEOUT). ``raised``: the
    code of a raising step (no verdict; ``message`` names it), stored as the error's code.
    ``fence``: the poller's claim (:func:`observe`), a condition of the count and the failure."""
    now = rt.now()
    last_error = f"{code}: {message}" if code else message
    error_code = str(code) if code else raised
    # an error with no code (a failed read, a failed fetch, a raising step) is no verdict about
    # the task: it never erases the last upstream verdict (not found, expired media…); "still
    # running" (no error at all) is one
    verdict = code is not None or message is None
    if not past_threshold(rt, job, kind, now):
        if last_error:
            _note_error(rt, job, last_error, verdict, error_code)
        return "in_flight"
    with rt.sessions.begin() as session:
        counted = jobstore.count_attempt(session, job.id, now, rt.settings.scaled(ATTEMPT_SPACING),
                                         last_error, verdict=verdict, code=error_code,
                                         where=fence)
    if counted is None:
        if last_error:
            _note_error(rt, job, last_error, verdict, error_code)
        if fence and horizon.exhausted(job):
            # an attempt spaced too close to the last one, counted by a reader that left the
            # job's exhaustion to this poller (the sweep while a poller held the row): it
            # exhausts it now, under its own claim
            return exhaust(rt, job, where=fence)
        return "in_flight"
    if not horizon.exhausted(counted):
        return "in_flight"
    return exhaust(rt, counted, where=fence)


def _note_error(rt: Runtime, job: Job, last_error: str, verdict: bool,
                code: str | None = None) -> None:
    """``note_error``, only when it changes the row as this step read it (``job`` is the
    step's own fresh row, kept in step with what it writes)."""
    from ..core import redact

    current, new = job.reconcile_last_error, redact.text(last_error)
    if not verdict and jobstore.is_verdict(jobstore.last_error_code(job)):
        return  # an error that is no verdict keeps the upstream one
    if current == new:
        return
    with rt.sessions.begin() as session:
        if not jobstore.note_error(session, job.id, last_error, verdict=verdict, code=code):
            return  # no longer in flight: the row was not written
    job.reconcile_last_error, job.reconcile_last_error_code = new, code


def exhaust(rt: Runtime, job: Job, *, where: tuple[Any, ...] = ()) -> str:
    """Attempts exhausted: fail with the last error's code (or UPSTREAM_TIMEOUT) + anomaly
    (``where``: further conditions of the failure's CAS, a poller's claim). Refused while the
    row's storing mark lasts with a storer counted (:func:`storing_hold`): someone read
    "succeeded" and may still be storing the outputs; a later read exhausts the job once the
    mark has ended or its storers' storings failed."""
    last = job.reconcile_last_error or ""
    found = jobstore.last_error_code(job)  # the column (legacy rows: their text's prefix)
    code = found if found is not None and (jobstore.is_verdict(found) or found == ErrorCode.INTERNAL) \
        else ErrorCode.UPSTREAM_TIMEOUT
    message = ("The provider did not finish in time." if code == ErrorCode.UPSTREAM_TIMEOUT
               else last.split(": ", 1)[-1])
    ok = fail_job(rt, job.id, code, message,
                  {"attempts": job.reconcile_attempts, "last_error": last or None},
                  anomaly="reconcile_exhausted",
                  # never while a success read by anyone may still be being stored
                  where=(*where, jobstore.not_storing(rt.now())))
    return "failed" if ok else "lost"
