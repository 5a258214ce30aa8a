"""Process control of a chaos run: the run's shared state, the Celery workers (started, killed by
process group, replaced), the fault schedule firing (worker kills, Redis restarts, terminated
PostgreSQL backends) and the watchdog that turns an unplanned exit or a stalled worker into a
violation."""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...celery_install import QUEUES
from ...settings import Settings
from ..processes import CeleryWorker, ScratchRedis
from .plan import Fault, Plan

log = logging.getLogger("reconcile.chaos")

PG_ADMIN_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"
# the library's default poll mode (its one home: Settings.poll_mode), not the environment's
DEFAULT_POLL_MODE: str = Settings.model_fields["poll_mode"].default


@dataclass
class ChaosConfig:
    jobs: int = 300
    seed: int | None = None
    workers: int = 2
    concurrency: int = 2
    time_scale: float = 0.05
    rate: float = 12.0  # jobs submitted per second
    # the least wait after the window before jobs past their liveness horizon are reported
    # (None: from N); jobs within their horizon are always waited for (run._settle)
    settle_timeout: float | None = None
    pg_admin: str = PG_ADMIN_DEFAULT
    workdir: str | None = None
    keep: bool = False
    quiet: bool = False
    # the database's default TimeZone (ALTER DATABASE … SET timezone; None: the server's): the
    # library's sessions must still read and write UTC (README: Timestamps mean UTC)
    db_timezone: str | None = None
    # the platform's jobs/usage_logs created before the migrations with timestamp without time
    # zone columns (holding UTC, as Rails keeps them) instead of the baseline's timestamptz
    naive_timestamps: bool = False
    # the settlement policy, "FAILURE,CANCEL" refund shares ("1/2,1/3"; chaos.policy), set in
    # every process's settings and environment (None: drawn from the seed)
    policy: str | None = None
    # RECONCILE_POLL_MODE in every process, the library's default unless given: "batch" has no
    # poll messages; the run's own beat thread sends reconcile.poll_due to the workers every
    # POLL_BATCH_INTERVAL (scaled), as celery beat does with the library's schedule; "chain": a
    # message per poll
    poll_mode: str = DEFAULT_POLL_MODE

    def shape_options(self) -> list[str]:
        """The command-line options that shape the run beyond its seed and size (the report's
        replay line repeats them)."""
        options = ["--db-timezone", self.db_timezone] if self.db_timezone else []
        options += ["--policy", self.policy] if self.policy else []
        options += ["--poll-mode", self.poll_mode] if self.poll_mode != DEFAULT_POLL_MODE else []
        return options + (["--naive-timestamps"] if self.naive_timestamps else [])


class _Run:
    """One chaos run's moving parts (see :func:`run`)."""

    def __init__(self, config: ChaosConfig, plan: Plan, workdir: Path) -> None:
        self.config, self.plan, self.workdir = config, plan, workdir
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.recovered_ids: set[uuid.UUID] = set()
        self.workers: list[CeleryWorker | None] = [None] * config.workers
        self.expected_down: set[int] = set()
        self.failed_submits: set[uuid.UUID] = set()
        # invariant violations seen while running (an unplanned worker exit, a stalled worker)
        self.live_violations: list[str] = []
        self.faults_done = threading.Event()
        self.threads: list[threading.Thread] = []
        self.started = time.monotonic()
        self.settle_seconds = 0.0  # from the window's end until every job settled (or gave up)

    def bump(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] += n

    def say(self, message: str) -> None:
        if not self.config.quiet:
            print(f"[chaos {time.monotonic() - self.started:7.1f}s] {message}", flush=True)


def _pg_url(admin: str, name: str) -> str:
    base = admin.rsplit("/", 1)[0]
    return base.replace("postgresql://", "postgresql+psycopg://", 1) + "/" + name


def _quiet(sim: Any) -> Any:
    """A worker SIGKILLed mid-request hangs up on the simulator: that is the point of the run,
    not an error worth a traceback on stderr (other server errors still print)."""
    server = sim._server
    default = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            default(request, client_address)

    server.handle_error = handle_error
    return sim


def _counting(state: _Run, name: str, fn: Callable[..., None]) -> Callable[..., None]:
    """A publish that may fail (the broker is down): counted, swallowed — the sweep recovers."""

    def call(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            state.bump(name)
            log.info("chaos_publish_lost error=%s", exc)

    return call


def _start_workers(state: _Run, env: Mapping[str, str]) -> None:
    for index in range(state.config.workers):
        state.workers[index] = _spawn(state, index, env)
    for worker in state.workers:
        assert worker is not None
        worker.wait_ready()


def _spawn(state: _Run, index: int, env: Mapping[str, str]) -> CeleryWorker:
    return CeleryWorker(env, state.workdir / f"worker{index}.log",
                        concurrency=state.config.concurrency, name=f"chaos{index}")


def _stop_workers(state: _Run) -> None:
    for index, worker in enumerate(state.workers):
        if worker is not None:
            worker.stop()
            state.workers[index] = None


def _faults(state: _Run, redis_server: ScratchRedis, env: Mapping[str, str],
            db_name: str) -> None:
    """Fire the seeded schedule (the actions are the seed's; only their timing is noisy)."""
    for fault in state.plan.faults:
        delay = state.started + fault.at - time.monotonic()
        if delay > 0 and state.stop.wait(delay):
            break
        try:
            if fault.action == "kill_worker":
                _kill_worker(state, fault, env)
            elif fault.action == "redis_restart":
                state.say(f"redis restart (down {fault.down_for}s)")
                redis_server.restart(fault.down_for)
            elif fault.action == "pg_terminate":
                n = _pg_terminate(state.config.pg_admin, db_name)
                state.bump("pg_terminations")
                state.bump("pg_backends_terminated", n)
                state.say(f"pg_terminate_backend: {n} backends")
        except Exception:
            log.exception("chaos_fault_failed fault=%s", fault)
            state.bump("fault_errors")
    state.faults_done.set()


def _kill_worker(state: _Run, fault: Fault, env: Mapping[str, str]) -> None:
    index = fault.target
    worker = state.workers[index]
    with state.lock:
        state.expected_down.add(index)
    if worker is not None:
        worker.kill_group()
        worker.stop()
        state.bump("kills")
        state.say(f"SIGKILL worker{index} (process group); back in {fault.down_for}s")
    time.sleep(fault.down_for)
    state.workers[index] = _spawn(state, index, env)
    state.bump("worker_restarts")
    with state.lock:
        state.expected_down.discard(index)


# a live worker that receives no message for this long while messages wait in its queue has
# stopped consuming (what a liveness probe must catch): an invariant violation
STALL_SECONDS = 30.0


@dataclass
class _Progress:
    """How far one worker process's log has been read, and when it last received a task."""

    worker: CeleryWorker
    offset: int
    last_received: float


def _watchdog(state: _Run, env: Mapping[str, str], redis_server: ScratchRedis) -> None:
    """Every worker exit the schedule did not plan, and every worker that stops consuming while
    messages wait, is an invariant violation (recorded; the worker is then replaced, as a
    supervisor would, so the run can finish and report)."""
    progress: dict[int, _Progress] = {}
    waiting_since: float | None = None
    while not state.stop.wait(0.5):
        now = time.monotonic()
        depth = _queue_depth(redis_server)
        waiting_since = (waiting_since or now) if depth else None
        for index, worker in enumerate(state.workers):
            with state.lock:
                expected = index in state.expected_down
            if worker is None or expected:
                progress.pop(index, None)
                continue
            if not worker.alive():
                _violation(state, f"unplanned_worker_exit worker{index}: {worker.tail(600)!r}")
                state.bump("unplanned_worker_exits")
                _replace(state, index, env)
                continue
            seen = progress.get(index)
            if seen is None or seen.worker is not worker:
                seen = progress[index] = _Progress(worker, 0, now)
            seen.offset, received = _received_since(worker, seen.offset)
            if received:
                seen.last_received = now
            elif waiting_since is not None and now - max(seen.last_received, waiting_since) \
                    >= STALL_SECONDS:
                _violation(state, f"worker_stalled worker{index}: alive, no task received for "
                                  f"{now - seen.last_received:.0f}s while {depth} messages waited")
                state.bump("stalled_workers")
                worker.kill_group()
                _replace(state, index, env)


def _violation(state: _Run, text: str) -> None:
    state.say(text)
    with state.lock:
        state.live_violations.append(text)


def _replace(state: _Run, index: int, env: Mapping[str, str]) -> None:
    worker = state.workers[index]
    if worker is not None:
        worker.stop()
    state.workers[index] = _spawn(state, index, env)


def _received_since(worker: CeleryWorker, offset: int) -> tuple[int, int]:
    """(new offset, tasks received since ``offset``) from the worker's own log lines."""
    try:
        with open(worker.log_path, "rb") as fh:
            fh.seek(max(offset, worker.log_start))
            chunk = fh.read()
    except OSError:
        return offset, 0
    end = chunk.rfind(b"\n") + 1  # a half-written line is read next time
    return max(offset, worker.log_start) + end, chunk[:end].count(b"] received")


def _queue_depth(redis_server: ScratchRedis) -> int:
    """Messages waiting in the library's queues (0 when Redis is down: nothing can wait)."""
    import redis

    try:
        client = redis.Redis(port=redis_server.port, socket_timeout=1, socket_connect_timeout=1)
        return sum(int(client.llen(queue)) for queue in QUEUES)
    except redis.RedisError:
        return 0


def _pg_terminate(admin: str, db_name: str) -> int:
    import psycopg

    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()", (db_name,)).fetchall()
    return len(rows)
