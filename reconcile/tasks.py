"""Thin Celery tasks: ids in, one plain function out. Names are ``reconcile.*``.

Every task is safe to run twice: creates win a claim before calling the provider, polls are
fenced by generation + sequence, settlements and completions are compare-and-set.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from celery import shared_task

from . import lifecycle
from .runtime import Runtime
from .settings import Settings, get_settings
from .worker import broker, heartbeat
from .worker.installed import connect_worker_checks, send

__all__ = [
    "create", "enqueue_create", "enqueue_poll", "enqueue_reconcile_job", "enqueue_reconcile_jobs",
    "get_runtime",
    "has_runtime", "poll",
    "poll_due", "prune", "reconcile_job", "reconcile_jobs", "reset_runtime", "set_runtime", "settle", "sweep",
]

log = logging.getLogger("reconcile.tasks")

broker.survive_broker_loss()  # any worker running these tasks, whatever app it built
connect_worker_checks()  # its start-up check too, for an app configured by hand

_RUNTIME: dict[int, Runtime] = {}


def get_runtime() -> Runtime:
    """This process's runtime, built from the environment on first use; its ``worker_id`` is
    the process's live heartbeat id (:mod:`reconcile.worker.heartbeat`), when it has one."""
    rt = _RUNTIME.get(os.getpid())
    if rt is None:
        rt = Runtime.from_settings(Settings(), enqueue_create=enqueue_create,
                                   enqueue_poll=enqueue_poll)
        _install_crash_hook(rt)
        # a runtime set meanwhile (set_runtime from the platform's worker_process_init, while
        # the heartbeat's reaper thread built this one) wins
        rt = _RUNTIME.setdefault(os.getpid(), rt)
    live = heartbeat.current_id()
    if live is not None and rt.worker_id != live:
        rt.worker_id = live
    return rt


def set_runtime(rt: Runtime) -> None:
    """Use ``rt`` in this process (tests, or a platform wiring its own hooks)."""
    rt.enqueue_create = enqueue_create
    rt.enqueue_poll = enqueue_poll
    _RUNTIME[os.getpid()] = rt


def reset_runtime() -> None:
    _RUNTIME.clear()


def has_runtime() -> bool:
    """Whether this process has its runtime already (set, or built by a task)."""
    return os.getpid() in _RUNTIME


def _install_crash_hook(rt: Runtime) -> None:
    """Reliability harness only. ``RECONCILE_TEST_CRASH_AT=<point>`` SIGKILLs, when the named
    point is reached, the whole worker (``RECONCILE_TEST_CRASH_MODE=group``, the default: main
    process and children) or only this pool child (``self``). With
    ``RECONCILE_TEST_CRASH_ONCE=<path>`` it crashes only the first time (the file marks it)."""
    point = os.environ.get("RECONCILE_TEST_CRASH_AT")
    if not point:
        return
    import signal

    mode = os.environ.get("RECONCILE_TEST_CRASH_MODE", "group")
    once = os.environ.get("RECONCILE_TEST_CRASH_ONCE")

    def crash(name: str) -> None:
        if name != point:
            return
        if once:
            try:
                fd = os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.close(fd)
        log.warning("test_crash point=%s pid=%s mode=%s", name, os.getpid(), mode)
        if mode == "self":
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            os.killpg(os.getpgid(0), signal.SIGKILL)

    rt.crash_hook = crash


# Enqueues go through the app the library was installed on (reconcile.install), never Celery's
# thread-local current app: in a web server's worker thread that is Celery's default app. Every
# countdown is capped below the broker's limits (reconcile.worker.broker).
def _settings() -> Settings:
    rt = _RUNTIME.get(os.getpid())
    return rt.settings if rt is not None else get_settings()


def enqueue_create(job_id: uuid.UUID, countdown: float = 0.0) -> None:
    send("reconcile.create", [str(job_id)], broker.cap_countdown(countdown, _settings()))


# the poll message's header carrying the provider's status the chain's last read saw: a header,
# not an argument, so that a worker of an earlier release (whose task takes three arguments)
# runs the message as before, and a message sent by one is read with no status
_STATUS_HEADER = "reconcile_provider_status"


def enqueue_poll(job_id: uuid.UUID, generation: int, seq: int, countdown: float,
                 status: str | None = None) -> None:
    send("reconcile.poll", [str(job_id), generation, seq],
         broker.cap_countdown(countdown, _settings()),
         headers={_STATUS_HEADER: status} if status is not None else None)


def enqueue_reconcile_job(job_id: uuid.UUID) -> None:
    send("reconcile.reconcile_job", [str(job_id)])


def enqueue_reconcile_jobs(job_ids: list[uuid.UUID]) -> None:
    send("reconcile.reconcile_jobs", [[str(job_id) for job_id in job_ids]])


# rows per fanned-out message, per ``sweep_threads``: a chunk's threads go on to its next rows
# instead of waiting for its slowest one (bench figure 2 on 2 cores, 4 threads: chunks of 4
# ran 126 jobs/s at 69% CPU per worker process, chunks of 16 more)
CHUNK_ROWS_PER_THREAD = 4


class _Chunks:
    """The sweep task's fan-out: the rows past its time budget, sent ``size`` per message
    (``reconcile.reconcile_jobs``, which carries them out ``sweep_threads`` at a time) instead
    of one message each. A row not sent (the tick died first) was not claimed: the next tick
    finds it again."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.held: list[uuid.UUID] = []

    def __call__(self, job_id: uuid.UUID) -> None:
        self.held.append(job_id)
        if len(self.held) >= self.size:
            self.flush()

    def flush(self) -> None:
        held, self.held = self.held, []
        if held:
            enqueue_reconcile_jobs(held)


def _redelivery(task: Any) -> None:
    info = getattr(task.request, "delivery_info", None) or {}
    if info.get("redelivered"):
        log.info("task_redelivered task=%s id=%s", task.name, task.request.id)


@shared_task(name="reconcile.create", bind=True, ignore_result=True, acks_late=True)
def create(self: Any, job_id: str) -> str:
    """Run the create of one job (claims first; a duplicate message exits)."""
    _redelivery(self)
    return lifecycle.create_step(get_runtime(), uuid.UUID(job_id)).action


@shared_task(name="reconcile.poll", bind=True, ignore_result=True, acks_late=True)
def poll(self: Any, job_id: str, generation: int, seq: int) -> str:
    """One fenced status read of one job; reschedules itself while in flight. The message's
    status header (the chain's previous read) is stored by the turn."""
    _redelivery(self)
    return lifecycle.poll_step(get_runtime(), uuid.UUID(job_id), int(generation), int(seq),
                               status=_carried_status(self))


def _carried_status(task: Any) -> str | None:
    """The status header of the message being run (None: none, or not text)."""
    return _header(task, _STATUS_HEADER)


def _header(task: Any, name: str) -> str | None:
    """The message's header ``name`` (None: none, or not text)."""
    headers = getattr(task.request, "headers", None)
    value = headers.get(name) if isinstance(headers, dict) else None
    if value is None:  # a worker's request also holds its custom headers as attributes
        value = getattr(task.request, name, None)
    return value if isinstance(value, str) else None


# the header of a poll_due that sends no helper: a helper (sent to share a full claim's due
# rows) and the re-send of a run whose budget ran out; so each beat tick sends at most one. A
# header, so that a worker of an earlier release runs such a message as a tick
_HELPER_HEADER = "reconcile_poll_due_helper"


class _OffThread:
    """Sends one ``poll_due`` (``message(*args)``) on a daemon thread, one at a time per process:
    the run goes on at once, whatever the broker does (a broker that accepts the connection and
    never answers would block the publish, and with it the helper's claimed rows until their
    lease ends, or the tick's worker process; a daemon thread never holds the process's exit
    either). While a send is still pending, another is dropped, not queued: a helper and a wake
    are optimisations, and the beat's ticks go on. A forked child sees the parent's thread as
    not alive, so it sends its own."""

    def __init__(self, what: str, message: Callable[..., None]) -> None:
        self._what, self._message = what, message
        self._lock = threading.Lock()
        self._pending: threading.Thread | None = None

    def __call__(self, *args: Any) -> None:
        with self._lock:
            if self._pending is not None and self._pending.is_alive():
                log.warning("poll_due_%s_skipped: the previous one is not sent yet", self._what)
                return
            self._pending = threading.Thread(target=self._send, args=args, daemon=True,
                                             name=f"reconcile-poll-due-{self._what}")
            self._pending.start()

    def wait(self, timeout: float | None = None) -> None:
        """Until the pending send (if any) is done (tests; a worker never waits)."""
        pending = self._pending
        if pending is not None:
            pending.join(timeout)

    def _send(self, *args: Any) -> None:
        try:
            self._message(*args)
        except Exception:
            log.warning("poll_due_%s_not_sent", self._what, exc_info=True)


def _helper_message(rt: Runtime) -> None:
    send("reconcile.poll_due", [], headers={_HELPER_HEADER: "1"},
         expires=rt.settings.poll_due_tick[1])


def _wake_message(rt: Runtime, countdown: float, until: datetime, hop: int) -> None:
    send("reconcile.poll_due", [], countdown,
         headers={_HELPER_HEADER: "1", _WAKE_HEADER: repr(until.timestamp()),
                  _WAKE_HOP_HEADER: str(hop)},
         expires=countdown + rt.settings.poll_due_tick[1])


_send_helper = _OffThread("helper", _helper_message)
_send_wake = _OffThread("wake", _wake_message)


@shared_task(name="reconcile.poll_due", bind=True, ignore_result=True, acks_late=True)
def poll_due(self: Any) -> str:
    """RECONCILE_POLL_MODE=batch: claim, read and write batches of due rows (beat, every
    POLL_BATCH_INTERVAL s); re-enqueues itself once when its time budget ran out with rows
    still due. A tick whose first claim is full sends one helper ``poll_due`` (expiring as a
    tick does, sent on a thread of its own), which an idle worker process runs beside it. A
    run that finds a row falling due before the next tick sends a wake, due then
    (:func:`_wake`). Chain mode: nothing."""
    from .lifecycle.batch import poll_due as run

    rt = get_runtime()
    if rt.settings.poll_mode != "batch":
        return "off"
    wake = _wake_plan(self, rt)
    helper = None if _header(self, _HELPER_HEADER) else partial(_send_helper, rt)
    report = run(rt, helper=helper)
    if report.more:
        send("reconcile.poll_due", [], headers={_HELPER_HEADER: "1"})
    elif wake is not None:
        _wake(rt, *wake)
    return report.line()


# the headers of a wake: the ``poll_due`` a run sends to arrive when the next row falls due
# before the next beat tick (``reconcile.lifecycle.batch.wake_in``). Its tick's time (POSIX
# seconds), which no wake of the chain passes, and its place in the chain (1 for a tick's
# wake). A wake also carries the helper header, so it sends no helper, here and on a worker of
# an earlier release
_WAKE_HEADER = "reconcile_poll_due_wake_until"
_WAKE_HOP_HEADER = "reconcile_poll_due_wake_hop"


def _wake_plan(task: Any, rt: Runtime) -> tuple[datetime, int] | None:
    """Until when this run may send a wake, and that wake's place in its chain: a beat tick
    (or a worker's fallback nudge) until its next tick, as the first; a wake until its header's
    time but never past this process's own next tick (a header from a worker with a longer
    interval, or forged, ends its chain within one tick here), as the next, while fewer than
    ``WAKES_PER_TICK - 1`` came before it (a clock that does not move, or Celery's eager mode
    running each wake at once, ends its chain there). None: no wake (a helper, a re-send, the
    chain's last, or headers that are no time or no place)."""
    from .lifecycle.batch import WAKES_PER_TICK

    every, _ = rt.settings.poll_due_tick
    own = rt.now() + timedelta(seconds=every)
    until = _header(task, _WAKE_HEADER)
    if until is None:
        return None if _header(task, _HELPER_HEADER) else (own, 1)
    try:
        hop = int(_header(task, _WAKE_HOP_HEADER) or "")
        return (min(datetime.fromtimestamp(float(until), UTC), own), hop + 1) \
            if 0 < hop < WAKES_PER_TICK - 1 else None
    except (ValueError, OverflowError, OSError):
        return None


def _wake(rt: Runtime, until: datetime, hop: int) -> None:
    """Send the wake on a thread of its own (an optimisation: the beat's ticks go on, so a
    failed lookup or send is logged and dropped). It expires as a tick does, counted from
    when it is due. A countdown past ``MAX_COUNTDOWN`` (the broker's bound,
    ``broker.cap_countdown``; a tick that long) sends none: the tick claims the row."""
    from .lifecycle.batch import wake_in

    try:
        countdown = wake_in(rt, until)
    except Exception:
        log.warning("poll_due_wake_not_sent", exc_info=True)
        return
    if countdown is not None and broker.cap_countdown(countdown, rt.settings) == countdown:
        _send_wake(rt, countdown, until, hop)


@shared_task(name="reconcile.settle", ignore_result=True, acks_late=True)
def settle(job_id: str) -> str:
    """Retry a failed/cancelled job's refund settlement; returns the
    :class:`~reconcile.settlement.SettleOutcome` (a string)."""
    return lifecycle.settle(get_runtime(), uuid.UUID(job_id))


@shared_task(name="reconcile.reconcile_job", ignore_result=True, acks_late=True)
def reconcile_job(job_id: str) -> str:
    """Apply the sweep's decision table to one job (the sweep fans out to this)."""
    from .sweep import reconcile_job as run

    return run(get_runtime(), uuid.UUID(job_id))


@shared_task(name="reconcile.reconcile_jobs", bind=True, ignore_result=True, acks_late=True)
def reconcile_jobs(self: Any, job_ids: list[str]) -> str:
    """Apply the sweep's decision table to a chunk of jobs (the sweep fans out to this),
    ``sweep_threads`` at a time. The rows that would start too late to finish within the soft
    time limit (``sweep.row_bound``) are sent again as a chunk of their own."""
    from .sweep import tick

    rt = get_runtime()
    limit = self.app.conf.task_soft_time_limit or self.app.conf.task_time_limit
    start_by = None if not limit else \
        time.monotonic() + float(limit) - tick.row_bound(rt).total_seconds()
    ids = [uuid.UUID(job_id) for job_id in job_ids]
    outcomes = tick.reconcile_jobs(rt, ids, threads=rt.settings.sweep_threads,
                                   start_by=start_by)
    deferred = [job_id for job_id, outcome in zip(ids, outcomes, strict=True)
                if outcome == tick.DEFERRED]
    if deferred:  # not claimed: should the send fail, the next tick finds them again
        log.info("reconcile_jobs_deferred count=%d", len(deferred))
        enqueue_reconcile_jobs(deferred)
    return ",".join(outcomes)


@shared_task(name="reconcile.sweep", ignore_result=True, acks_late=True)
def sweep() -> str:
    """One reconcile tick (beat): the rows of a page ``sweep_threads`` at a time; what does not
    fit the time budget fans out in chunks of ``CHUNK_ROWS_PER_THREAD`` times as many
    (``reconcile.reconcile_jobs``)."""
    from .sweep import sweep as run

    rt = get_runtime()
    chunks = _Chunks(CHUNK_ROWS_PER_THREAD * rt.settings.sweep_threads)
    try:
        report = run(rt, fan_out=chunks, threads=rt.settings.sweep_threads)
    finally:
        chunks.flush()
    return report.line()


@shared_task(name="reconcile.prune", ignore_result=True, acks_late=True)
def prune() -> str:
    """Retention (beat, when a retention is set): published events, settled-job deliveries."""
    from .jobstore.retention import days, prune as run

    rt = get_runtime()
    s = rt.settings
    return run(rt.sessions, now=rt.now(), events=days(s.job_events_retention_days),
               deliveries=days(s.webhook_deliveries_retention_days)).line()
