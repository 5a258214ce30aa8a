"""Internal: the library's own mechanics, not an import path for platforms (may move).

A systematic interleaving explorer (CHESS / loom style) for two writers on one job.

The chaos run is random; this is not. Two writers — real library functions (the create owner,
the poll chain, the sweep, a webhook, a user cancel, the operator CLI, settle, the orchestrator's
``wait_for_job``, ``sync_call``) — run in two threads, each on its own engine and sessions, on
real PostgreSQL, against the shipped provider simulator over loopback. A SQLAlchemy
``before_cursor_execute`` / ``commit`` hook parks every writer before each SQL statement (and
before each COMMIT of a transaction that wrote or locked something), so exactly one writer runs
from one boundary to its next at a time. A *schedule* is the sequence of choices made at the
boundaries: which writer goes on (``0`` or ``1``), or ``t<i>`` — advance the injected clock past
the scenario's i-th deadline (a lease, a threshold, a timeout; hole 1 only exists when a lease
expires mid-step).

Schedules are enumerated depth-first with a preemption bound (a switch away from a writer that
could have gone on costs one) and a clock-jump bound, each schedule replayed from a fresh
database state. Two reductions keep the tree small without losing behaviours: statements that
touch only the event outbox, savepoints and the COMMIT of a read-only transaction are no
boundaries; and a clock jump is only placed before a step that reads the clock (a jump before a
clock-free step commutes with it). A writer waiting on a row lock is detected through
``pg_stat_activity`` (``wait_event_type = 'Lock'`` for its backend pid), never by timing, and
the other writer runs. A writer that waits for time or for the other writer (``wait_for_job``'s
sleep, a webhook waiting for its upstream task) parks at a *sleep point*, enabled again only
after a step that committed a change, or a clock jump (what it waits for is committed state or
time; re-reading an unchanged state is the same schedule).

After each schedule the invariants are checked, then the system is driven to quiescence the way
production would (queued create/poll messages run, the clock advances to the next deadline, the
sweep ticks) and checked again: at most one upstream create and one completion; never completed
after cancel; never cancel the polled task; at most one settlement, exactly one once terminal and
past the settle grace; ``credits.audit`` clean; no in-flight job left without a live path (only
an ``uncertain`` submission is held on purpose); no workflow execution failed solely by a node
whose job completed; no paid sync call for a cancelled job.

Run it::

    python -m reconcile.testing.explorer                       # every scenario, full bounds
    python -m reconcile.testing.explorer --scenario create/resolve_upstream --replay "0 0 t0 0 1"

Scenarios (the writer pairs and their starting states) are in
:mod:`reconcile.testing.explorer_scenarios`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import re
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

log = logging.getLogger("reconcile.explorer")

PG_ADMIN_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"
START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)  # every schedule starts at this virtual time
STEP_TIMEOUT = 60.0  # real seconds one step may take before the schedule counts as hung
MAX_DECISIONS = 400  # steps in one schedule before it counts as a livelock
_LOCK_POLL = 0.002  # seconds between checks while a writer runs
_LOCK_GRACE = 0.01  # seconds a step runs before PostgreSQL is asked whether it waits on a lock


class ExplorerAbort(BaseException):
    """Raised inside a writer thread when its schedule is abandoned (never caught by writers)."""


# ----------------------------------------------------------------------------- the clock


class VirtualClock:
    """The injected clock (aware UTC). Records which writer thread read it during its step."""

    def __init__(self, start: datetime = START) -> None:
        self.now = start
        self.reader: Callable[[], None] | None = None

    def __call__(self) -> datetime:
        if self.reader is not None:
            self.reader()
        return self.now

    def seconds(self) -> float:
        """The simulator's clock: the same instant as a float."""
        return self.now.timestamp()


# ----------------------------------------------------------------------------- queues


@dataclass
class Queues:
    """The create/poll messages a Celery worker would receive (countdowns are ignored)."""

    creates: deque[uuid.UUID] = field(default_factory=deque)
    polls: deque[tuple[uuid.UUID, int, int]] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enqueue_create(self, job_id: uuid.UUID, countdown: float = 0.0) -> None:
        with self.lock:
            self.creates.append(job_id)

    def enqueue_poll(self, job_id: uuid.UUID, generation: int, seq: int, countdown: float) -> None:
        with self.lock:
            self.polls.append((job_id, generation, seq))

    def clear(self) -> None:
        with self.lock:
            self.creates.clear()
            self.polls.clear()


# ----------------------------------------------------------------------------- statements

_SKIP = re.compile(r"^\s*(SAVEPOINT|RELEASE SAVEPOINT|ROLLBACK TO SAVEPOINT)\b", re.I)
_WRITE = re.compile(r"^\s*(UPDATE|INSERT|DELETE)\b|\bFOR UPDATE\b|\bFOR NO KEY UPDATE\b", re.I)
_TABLES = re.compile(r"\b(?:FROM|INTO|(?<!FOR )UPDATE|JOIN)\s+\"?([a-z_][a-z0-9_]*)\"?", re.I)


def fingerprint(statement: str) -> str:
    """A short, parameter-free name for a statement: ``SELECT jobs FOR UPDATE``."""
    words = statement.split()
    verb = words[0].upper() if words else "?"
    tables = sorted(dict.fromkeys(t.lower() for t in _TABLES.findall(statement)))
    lock = " FOR UPDATE" if re.search(r"\bFOR UPDATE\b", statement, re.I) else ""
    return f"{verb} {','.join(tables)}{lock}".strip()


def _outbox_only(statement: str, outbox: str) -> bool:
    tables = {t.lower() for t in _TABLES.findall(statement)}
    return bool(tables) and tables <= {outbox}


# ----------------------------------------------------------------------------- one schedule


@dataclass
class _Slot:
    """One writer thread as the scheduler sees it."""

    index: int
    name: str
    state: str = "init"  # init | running | parked | sleeping | blocked | done
    label: str = "start"  # the boundary it waits at
    pid: int | None = None
    go: bool = False
    slept_at: int = -1  # world version when it went to sleep
    clock_read: bool = False  # did its current step read the clock
    thread: threading.Thread | None = None
    outcome: str | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class Decision:
    """One choice point: what could run, what ran, and the budget spent before it."""

    writers: tuple[int, ...]  # enabled writers
    marks: tuple[int, ...]  # deadlines still ahead (index into the scenario's marks)
    chosen: str  # "0", "1" or "t<i>"
    last: int | None  # the writer that ran the previous step
    last_parked: bool  # could ``last`` have gone on (then any other writer is a preemption)
    preemptions: int
    jumps: int
    clock_read: bool  # the chosen writer's step read the clock
    label: str  # the statement the chosen writer executed first
    changed: bool = True  # did the previous step commit, change the simulator or jump the clock
    pending: tuple[str, ...] = ()  # per writer: the boundary it waits at


class _Run:
    """The scheduler of one schedule: parks writer threads, grants steps, detects lock waits."""

    def __init__(self, explorer: Explorer, writers: Sequence[tuple[str, Callable[[], str]]]) -> None:
        self.explorer = explorer
        self.cond = threading.Condition()
        self.slots = [_Slot(i, name) for i, (name, _) in enumerate(writers)]
        self.bodies = [body for _, body in writers]
        self.version = 0  # bumped by a step that committed a change, and by a clock jump
        self.committed = False  # did the current step commit a change
        self._mutations = explorer.sim_mutations
        self.aborted = False
        self.by_thread: dict[int, _Slot] = {}

    # --- called in writer threads ---------------------------------------------------------------

    def slot_here(self) -> _Slot | None:
        return self.by_thread.get(threading.get_ident())

    def boundary(self, slot: _Slot, label: str, pid: int | None, *, sleeping: bool = False) -> None:
        with self.cond:
            if self.aborted:
                raise ExplorerAbort()
            slot.state = "sleeping" if sleeping else "parked"
            slot.label = label
            slot.pid = pid if pid is not None else slot.pid
            slot.slept_at = self.version
            self.cond.notify_all()
            while not slot.go and not self.aborted:
                self.cond.wait()
            if self.aborted:
                raise ExplorerAbort()
            slot.go = False

    def sleep_point(self, label: str = "sleep") -> None:
        """Where a writer waits for time to pass or for the other writer (never a real sleep)."""
        slot = self.slot_here()
        if slot is not None:
            self.boundary(slot, label, None, sleeping=True)

    def note_clock_read(self) -> None:
        slot = self.slot_here()
        if slot is not None:
            slot.clock_read = True

    def _body(self, slot: _Slot) -> None:
        self.by_thread[threading.get_ident()] = slot
        with self.cond:
            while not slot.go and not self.aborted:
                self.cond.wait()
            slot.go = False
        try:
            if not self.aborted:
                slot.outcome = self.bodies[slot.index]()
        except ExplorerAbort:
            slot.outcome = "aborted"
        except BaseException as exc:  # a writer that raises is an outcome, judged by invariants
            slot.error = exc
            slot.outcome = f"raised {type(exc).__name__}: {exc}"
        finally:
            with self.cond:
                slot.state = "done"
                self.cond.notify_all()

    # --- called by the controller ---------------------------------------------------------------

    def enabled(self) -> list[int]:
        with self.cond:
            return [s.index for s in self.slots if s.state in ("init", "parked")
                    or (s.state == "sleeping" and s.slept_at < self.version)]

    def sleepers(self) -> list[int]:
        with self.cond:
            return [s.index for s in self.slots if s.state == "sleeping"]

    def all_done(self) -> bool:
        with self.cond:
            return all(s.state == "done" for s in self.slots)

    def step(self, index: int) -> None:
        slot = self.slots[index]
        with self.cond:
            slot.clock_read = False
            start = slot.state == "init"
            slot.state = "running"
            slot.go = True
            self.committed = False
            if start:
                slot.thread = threading.Thread(target=self._body, args=(slot,), daemon=True,
                                               name=f"explorer-{slot.name}")
                slot.thread.start()
            self.cond.notify_all()
        self._quiesce()
        with self.cond:
            mutations = self.explorer.sim_mutations
            if self.committed or mutations != self._mutations:
                # what a sleeper waits for is committed state, the simulator or the clock
                self.version += 1
            self._mutations = mutations

    def recheck(self) -> None:
        """Lock waiters may have been granted their lock: let them run to their next boundary."""
        with self.cond:
            for s in self.slots:
                if s.state == "blocked":
                    s.state = "running"
        self._quiesce()

    def touch(self) -> None:
        """The world changed outside any writer (a clock jump): sleepers may go on."""
        with self.cond:
            self.version += 1

    def _quiesce(self) -> None:
        """Wait until no writer runs: each is parked, asleep, done, or waiting on a row lock."""
        started = time.monotonic()
        deadline = started + STEP_TIMEOUT
        while True:
            with self.cond:
                busy = [s for s in self.slots if s.state in ("running", "blocked")]
                if not any(s.state == "running" for s in busy):
                    # only lock waiters left: confirm they still wait (one may just have woken)
                    if all(self._lock_waiting(s) for s in busy):
                        return
                    for s in busy:
                        s.state = "running"
                    continue
                self.cond.wait(_LOCK_POLL)
            if time.monotonic() > deadline:
                raise TimeoutError(self._stuck(busy))
            if time.monotonic() - started < _LOCK_GRACE:
                continue  # most steps park within milliseconds: ask PostgreSQL only after that
            for s in busy:
                if s.state in ("running", "blocked") and s.pid is not None:
                    waiting = self._lock_waiting(s)
                    with self.cond:
                        if s.state == "running" and waiting:
                            s.state = "blocked"
                        elif s.state == "blocked" and not waiting:
                            s.state = "running"

    def _stuck(self, busy: list[_Slot]) -> str:
        """What a hung writer is doing: its state, its backend's wait and its Python stack."""
        import traceback

        frames = sys._current_frames()
        parts = []
        for s in busy:
            stack = ""
            if s.thread is not None and s.thread.ident in frames:
                stack = "".join(traceback.format_stack(frames[s.thread.ident], limit=6))
            parts.append(f"{s.name} {s.state} after {s.label} pid={s.pid} "
                         f"backend={self.explorer.backend(s.pid)}\n{stack}")
        return "a writer did not reach its next boundary: " + "\n".join(parts)

    def _lock_waiting(self, slot: _Slot) -> bool:
        return slot.pid is not None and self.explorer.lock_waiting(slot.pid)

    def abort(self) -> None:
        with self.cond:
            self.aborted = True
            pids = [s.pid for s in self.slots if s.state != "done" and s.pid is not None]
            self.cond.notify_all()
        for pid in pids:  # a writer stuck in a lock wait: end its backend, not the process
            if self.explorer.lock_waiting(pid):
                self.explorer.terminate_backend(pid)
        for s in self.slots:
            if s.thread is not None:
                s.thread.join(timeout=10)


# ----------------------------------------------------------------------------- scenarios


@dataclass
class Context:
    """What a scenario's setup, writers and checks share within one schedule."""

    explorer: Explorer
    job_id: uuid.UUID
    user_id: uuid.UUID
    facts: dict[str, Any] = field(default_factory=dict)  # what writers observed (e.g. paid calls)

    @property
    def sim(self) -> Any:
        return self.explorer.sim

    @property
    def clock(self) -> VirtualClock:
        return self.explorer.clock

    def sleep(self, *_: Any) -> None:
        """The writers' injected ``sleep``: a sleep point."""
        run = self.explorer.current
        if run is not None:
            run.sleep_point()

    def wait_for(self, condition: Callable[[], Any], tries: int = 4) -> Any:
        """Sleep points until ``condition()`` is truthy (at most ``tries``); its last value."""
        value = condition()
        for _ in range(tries):
            if value:
                return value
            self.sleep()
            value = condition()
        return value


# (rt, ctx) -> outcome
WriterFn = Callable[[Any, Context], str]


@dataclass(frozen=True)
class Writer:
    name: str
    run: WriterFn


@dataclass(frozen=True)
class Scenario:
    """Two writers from one starting state, the deadlines a clock jump may pass, and checks."""

    name: str
    setup: Callable[[Any, Context], None]  # (controller runtime, ctx)
    writers: tuple[Writer, Writer]
    marks: tuple[timedelta, ...] = ()  # offsets from START (+1 s is added) a jump may pass
    kind: str = "replicate-prediction"
    extra_checks: tuple[Callable[[Any, Context, str], list[str]], ...] = ()
    note: str = ""
    # settings every runtime of the scenario runs with (e.g. ``(("poll_mode", "batch"),)``)
    settings: tuple[tuple[str, Any], ...] = ()


@dataclass
class Bounds:
    preemptions: int = 2
    jumps: int = 1
    max_schedules: int = 5000  # per scenario


@dataclass
class ScheduleResult:
    choices: tuple[str, ...]
    trace: tuple[str, ...]
    violations: tuple[str, ...]
    outcomes: tuple[str, ...]
    decisions: tuple[Decision, ...] = ()
    diverged: bool = False

    def replay(self) -> str:
        return " ".join(self.choices)


@dataclass
class ScenarioReport:
    scenario: str
    schedules: int = 0
    distinct_traces: int = 0
    violating: int = 0
    diverged: int = 0
    seconds: float = 0.0
    truncated: bool = False
    first_violation: ScheduleResult | None = None
    first_violation_at: int = 0  # its number in the exploration order (1 = the first schedule)
    violation_kinds: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        status = "OK" if not self.violating else \
            f"VIOLATED ({self.violating}, first at #{self.first_violation_at})"
        kinds = (" " + ",".join(f"{k}×{n}" for k, n in sorted(self.violation_kinds.items()))
                 if self.violation_kinds else "")
        return (f"{self.scenario:<40} schedules={self.schedules:<5} distinct={self.distinct_traces:<5}"
                f" {self.seconds:6.1f}s {status}{kinds}{' (truncated)' if self.truncated else ''}")


# ----------------------------------------------------------------------------- the explorer

# the simulator's per-run state a snapshot carries (its ids keep counting: they never repeat)
_SIM_STATE = ("_job_scripts", "_model_scripts", "_tasks", "_sync_tasks", "_creates", "_attempts",
              "_limited", "_deliveries", "default_script")


@dataclass(frozen=True)
class _Snapshot:
    tables: dict[str, bytes]
    sim: dict[str, Any]
    facts: dict[str, Any]
    now: datetime



class Explorer:
    """Owns the database, the simulator, the engines and the hooks; runs schedules."""

    def __init__(self, database_url: str, *, workdir: Path, sim: Any | None = None) -> None:
        from sqlalchemy import event

        from ..db.models import JobEvent
        from ..db.session import make_engine, make_sessionmaker
        from .simulator import Simulator

        self.database_url = database_url
        self.workdir = workdir
        self.clock = VirtualClock()
        self.queues = Queues()
        self.current: _Run | None = None
        self._snapshots: dict[str, _Snapshot] = {}
        self._outbox = JobEvent.__table__.name
        self._own_sim = sim is None
        self.sim = sim or Simulator(seed=7, clock=self.clock.seconds).start()
        self.sim.wall_now = lambda: self.clock.now  # listings compare with our clock
        self.sim_mutations = 0  # upstream creates and state changes (cancels), counted
        for name in ("create", "call", "set_state"):
            setattr(self.sim, name, self._counting(getattr(self.sim, name)))
        self.engine = make_engine(database_url, pool_size=4, max_overflow=4, pool_pre_ping=False)
        self.writer_engines = []
        for _ in range(2):
            engine = make_engine(database_url, pool_size=3, max_overflow=3, pool_pre_ping=False)
            event.listen(engine, "connect", _fast_deadlocks)
            event.listen(engine, "before_cursor_execute", self._on_execute)
            event.listen(engine, "after_cursor_execute", self._after_execute)
            event.listen(engine, "commit", self._on_commit)
            event.listen(engine, "rollback", self._on_rollback)
            with engine.connect():  # dialect initialisation happens before any hook runs
                pass
            self.writer_engines.append(engine)
        self.sessions = make_sessionmaker(self.engine)
        self.writer_sessions = [make_sessionmaker(e) for e in self.writer_engines]
        import psycopg

        self._admin = psycopg.connect(_plain(database_url), autocommit=True)
        self._admin_lock = threading.Lock()
        self.rt = self._runtime(self.sessions)
        self.writer_rts = [self._runtime(s) for s in self.writer_sessions]
        self._base_settings = self.rt.settings

    def _counting(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.sim_mutations += 1
            return method(*args, **kwargs)
        return counted

    def close(self) -> None:
        self._admin.close()
        for engine in (self.engine, *self.writer_engines):
            engine.dispose()
        if self._own_sim:
            self.sim.stop()

    def __enter__(self) -> Explorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _runtime(self, sessions: Any) -> Any:
        import requests

        from ..runtime import Runtime
        from ..storage import LocalStorage

        return Runtime(
            settings=self.sim.settings(webhook_base_url="https://platform.example/hooks",
                                       database_url=self.database_url),
            sessions=sessions, storage=LocalStorage(self.workdir / "media"), clock=self.clock,
            http=requests.Session(),  # kept-alive loopback connections: media fetches are cheap
            enqueue_create=self.queues.enqueue_create, enqueue_poll=self.queues.enqueue_poll)

    # --- hooks (writer threads) -----------------------------------------------------------------

    def _on_execute(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                    executemany: bool) -> None:
        run = self.current
        slot = run.slot_here() if run is not None else None
        if slot is None:
            return
        pid = _backend_pid(conn)
        slot.pid = pid
        if _SKIP.match(statement) or _outbox_only(statement, self._outbox):
            return
        run.boundary(slot, fingerprint(statement), pid)

    def _after_execute(self, conn: Any, cursor: Any, statement: str, parameters: Any,
                       context: Any, executemany: bool) -> None:
        """A transaction that changed or locked a row (outside the outbox) makes its COMMIT a
        boundary; an UPDATE or a FOR UPDATE that matched nothing locked nothing."""
        run = self.current
        if run is None or run.slot_here() is None or _outbox_only(statement, self._outbox):
            return
        if _WRITE.search(statement) and cursor.rowcount != 0:
            conn.info["explorer_dirty"] = True

    def _on_commit(self, conn: Any) -> None:
        dirty = conn.info.pop("explorer_dirty", False)
        run = self.current
        slot = run.slot_here() if run is not None else None
        if slot is not None and dirty:
            run.boundary(slot, "COMMIT", _backend_pid(conn))
            run.committed = True

    def _on_rollback(self, conn: Any) -> None:
        conn.info.pop("explorer_dirty", None)

    # --- PostgreSQL -----------------------------------------------------------------------------

    def lock_waiting(self, pid: int) -> bool:
        with self._admin_lock:
            # the lock graph, not the backend's wait_event: a releasing commit grants the waiter's
            # lock in shared memory at once, before the woken backend updates its wait_event
            row = self._admin.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted)",
                (pid,)).fetchone()
        return bool(row and row[0])

    def backend(self, pid: int | None) -> Any:
        if pid is None:
            return None
        with self._admin_lock:
            return self._admin.execute(
                "SELECT state, wait_event_type, wait_event, left(query, 80) FROM pg_stat_activity"
                " WHERE pid = %s", (pid,)).fetchone()

    def terminate_backend(self, pid: int) -> None:
        with self._admin_lock:
            self._admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    def reset(self) -> None:
        """A clean database (every table of the library's metadata), simulator and clock."""
        from ..db.models import Base

        # DELETE, not TRUNCATE: a handful of rows, and no file operations per table
        script = "; ".join(f'DELETE FROM "{t.name}"' for t in reversed(Base.metadata.sorted_tables))
        with self._admin_lock:
            self._admin.execute(script)
        self.sim.reset()
        self.clock.now = START
        self.clock.reader = None
        self.queues.clear()

    def _prepare(self, scenario: Scenario) -> Context:
        """The scenario's starting state: built with the real lifecycle the first time, then
        restored from a snapshot (tables copied out and back, the simulator's tasks and
        counters) — the same state, without re-running the setup for every schedule."""
        from . import explorer_scenarios as sc

        ctx = Context(self, uuid.uuid5(uuid.NAMESPACE_URL, f"explorer/{scenario.name}/job"),
                      uuid.uuid5(uuid.NAMESPACE_URL, "explorer/user"))
        settings = self._base_settings.model_copy(update=dict(scenario.settings))
        for rt in (self.rt, *self.writer_rts):
            rt.settings = settings
        snapshot = self._snapshots.get(scenario.name)
        if snapshot is None:
            self.reset()
            sc.fund(self.rt, ctx)
            scenario.setup(self.rt, ctx)
            self._snapshots[scenario.name] = self._snapshot(ctx)
        else:
            self._restore(snapshot, ctx)
        return ctx

    def _snapshot(self, ctx: Context) -> _Snapshot:
        import copy

        from ..db.models import Base

        tables = {}
        with self._admin_lock, self._admin.cursor() as cur:
            for table in Base.metadata.sorted_tables:
                with cur.copy(f'COPY "{table.name}" TO STDOUT') as out:
                    tables[table.name] = b"".join(bytes(chunk) for chunk in out)
        sim = self.sim
        with sim._lock:
            state = copy.deepcopy({name: getattr(sim, name) for name in _SIM_STATE})
        return _Snapshot(tables, state, dict(ctx.facts), self.clock.now)

    def _restore(self, snapshot: _Snapshot, ctx: Context) -> None:
        import copy

        from ..db.models import Base

        self.reset()
        with self._admin_lock, self._admin.cursor() as cur:
            for table in Base.metadata.sorted_tables:  # parents first
                data = snapshot.tables[table.name]
                if data:
                    with cur.copy(f'COPY "{table.name}" FROM STDIN') as into:
                        into.write(data)
        sim = self.sim
        with sim._lock:
            for name, value in copy.deepcopy(snapshot.sim).items():
                setattr(sim, name, value)
        ctx.facts.update(copy.deepcopy(snapshot.facts))
        self.clock.now = snapshot.now

    # --- schedules ------------------------------------------------------------------------------

    def run_schedule(self, scenario: Scenario, prefix: Sequence[str]) -> ScheduleResult:
        """Replay ``prefix`` from a fresh state, then continue with the default policy."""
        from . import explorer_scenarios as sc

        ctx = self._prepare(scenario)
        marks = [START + m + timedelta(seconds=1) for m in scenario.marks]
        writers = [(w.name, _bind(w, rt, ctx)) for w, rt in zip(scenario.writers, self.writer_rts,
                                                                strict=True)]
        run = _Run(self, writers)
        self.current = run
        self.clock.reader = run.note_clock_read
        decisions: list[Decision] = []
        trace: list[str] = []
        diverged = False
        try:
            last: int | None = None
            preemptions = jumps = 0
            k = 0
            seen = -1
            stalled = time.monotonic()
            while not run.all_done():
                if k > MAX_DECISIONS:
                    raise TimeoutError(f"more than {MAX_DECISIONS} steps")
                enabled = run.enabled()
                ahead = tuple(i for i, m in enumerate(marks) if m > self.clock.now)
                if not enabled:
                    if run.sleepers():  # everyone waits for time: the next deadline comes
                        if ahead:
                            self._jump(run, marks[ahead[0]], trace, forced=True)
                        else:
                            run.touch()
                        continue
                    if time.monotonic() > stalled + STEP_TIMEOUT:
                        raise TimeoutError("no writer can run and none is done")
                    time.sleep(_LOCK_POLL)  # a lock waiter about to be granted: look again
                    run.recheck()
                    continue
                stalled = time.monotonic()
                last_parked = last is not None and run.slots[last].state == "parked"
                changed, seen = run.version != seen, run.version
                pending = tuple(sl.label for sl in run.slots)
                if k < len(prefix):
                    choice = prefix[k]
                    if not _available(choice, enabled, ahead):
                        diverged = True
                        choice = _default(last, enabled)
                else:
                    choice = _default(last, enabled)
                if choice.startswith("t"):
                    self._jump(run, marks[int(choice[1:])], trace, forced=False)
                    decisions.append(Decision(tuple(enabled), ahead, choice, last, last_parked,
                                              preemptions, jumps, False, "clock", changed, pending))
                    jumps += 1
                else:
                    index = int(choice)
                    label = run.slots[index].label
                    run.step(index)
                    slot = run.slots[index]
                    decisions.append(Decision(tuple(enabled), ahead, choice, last, last_parked,
                                              preemptions, jumps, slot.clock_read, label, changed,
                                              pending))
                    trace.append(f"{index}:{slot.name}: {label}")
                    trace += [f"{s.index}:{s.name}: waits on a row lock" for s in run.slots
                              if s.state == "blocked"]
                    if last_parked and index != last:
                        preemptions += 1
                    last = index
                k += 1
        except TimeoutError as exc:
            run.abort()
            self.current = None
            self.clock.reader = None
            return ScheduleResult(tuple(d.chosen for d in decisions), tuple(trace),
                                  (f"hang: {exc}",), (), tuple(decisions), diverged)
        finally:
            self.clock.reader = None
            self.current = None
        outcomes = tuple(f"{s.name}={s.outcome}" for s in run.slots)
        violations = sc.check(self.rt, ctx, scenario, "after writers")
        if not any(v.startswith("hang") for v in violations):
            violations += sc.quiesce_and_check(self.rt, ctx, scenario)
        return ScheduleResult(tuple(d.chosen for d in decisions), tuple(trace), tuple(violations),
                              outcomes, tuple(decisions), diverged)

    def _jump(self, run: _Run, to: datetime, trace: list[str], *, forced: bool) -> None:
        self.clock.now = to
        run.touch()
        trace.append(f"clock → +{to - START}{' (all waiting)' if forced else ''}")

    def explore(self, scenario: Scenario, bounds: Bounds,
                on_schedule: Callable[[ScheduleResult], None] | None = None, *,
                stop_at_first: bool = False) -> ScenarioReport:
        """Every schedule within ``bounds``, depth first; counts and the first violation.
        ``on_schedule`` sees every schedule's result; ``stop_at_first`` ends at a violation."""
        report = ScenarioReport(scenario.name)
        started = time.monotonic()
        stack: list[tuple[str, ...]] = [()]
        traces: set[tuple[str, ...]] = set()
        while stack:
            if report.schedules >= bounds.max_schedules:
                report.truncated = True
                break
            prefix = stack.pop()
            result = self.run_schedule(scenario, prefix)
            report.schedules += 1
            report.diverged += result.diverged
            traces.add(result.trace)
            if result.violations:
                report.violating += 1
                for v in result.violations:
                    key = v.split(":", 1)[0]
                    report.violation_kinds[key] = report.violation_kinds.get(key, 0) + 1
                if report.first_violation is None:
                    report.first_violation = result
                    report.first_violation_at = report.schedules
            if on_schedule is not None:
                on_schedule(result)
            if stop_at_first and result.violations:
                break
            stack.extend(reversed(_children(prefix, result.decisions, bounds)))
        report.distinct_traces = len(traces)
        report.seconds = time.monotonic() - started
        return report


def _bind(writer: Writer, rt: Any, ctx: Context) -> Callable[[], str]:
    return lambda: writer.run(rt, ctx)


def _available(choice: str, enabled: list[int], ahead: tuple[int, ...]) -> bool:
    if choice.startswith("t"):
        return int(choice[1:]) in ahead
    return int(choice) in enabled


def _default(last: int | None, enabled: list[int]) -> str:
    """Go on with the writer that ran last if it can; else the lowest-numbered one."""
    return str(last if last in enabled else enabled[0])


def _cost(d: Decision, writer: int) -> int:
    return 1 if d.last_parked and d.last is not None and writer != d.last else 0


def _children(prefix: tuple[str, ...], decisions: Sequence[Decision],
              bounds: Bounds) -> list[tuple[str, ...]]:
    """The unexplored schedules that branch off this run within the bounds.

    Positions inside ``prefix`` were branched by the runs that produced it, so only later ones
    branch here — each schedule is generated once. A clock jump goes right before a step that
    reads the clock: before the chosen writer's step when it read it (known from this run), and
    before the last prefix step when that one read it (the child that chose it finds out).
    """
    chosen = [d.chosen for d in decisions]
    out: list[tuple[str, ...]] = []
    p = len(prefix)
    for k, d in enumerate(decisions):
        if d.chosen.startswith("t"):
            continue
        after_jump = k > 0 and chosen[k - 1].startswith("t")
        if k >= p:
            for w in d.writers:
                if str(w) != d.chosen and d.preemptions + _cost(d, w) <= bounds.preemptions:
                    out.append(tuple(chosen[:k]) + (str(w),))
        if (k >= p or k == p - 1) and not after_jump and d.clock_read \
                and d.jumps < bounds.jumps:
            for mark in d.marks:
                out.append(tuple(chosen[:k]) + (f"t{mark}", d.chosen))
    return out


def _fast_deadlocks(dbapi_conn: Any, _record: Any) -> None:
    """Deadlocks between the two writers are found by PostgreSQL in 50 ms, not 1 s."""
    with contextlib.suppress(Exception):
        with dbapi_conn.cursor() as cur:
            cur.execute("SET deadlock_timeout = '50ms'")
        dbapi_conn.commit()


def _backend_pid(conn: Any) -> int | None:
    info = conn.info
    pid = info.get("explorer_pid")
    if pid is None:
        with contextlib.suppress(Exception):
            pid = info["explorer_pid"] = conn.connection.dbapi_connection.info.backend_pid
    return pid


def _plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


# ----------------------------------------------------------------------------- output


class _ThreadStdout(io.TextIOBase):
    """stdout for the main thread; what writer threads print (the CLI's echo) is dropped."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.main = threading.main_thread()

    def write(self, text: str) -> int:
        if threading.current_thread() is self.main:
            return self.real.write(text)
        return len(text)

    def flush(self) -> None:
        self.real.flush()


@contextlib.contextmanager
def quiet_writers() -> Iterator[None]:
    real_out, real_err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _ThreadStdout(real_out), _ThreadStdout(real_err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = real_out, real_err


def describe(result: ScheduleResult, scenario: Scenario) -> str:
    """A violating schedule, replayable: the choice string, the trace and what broke."""
    lines = [f"scenario {scenario.name}: {', '.join(result.violations)}",
             f"  replay: python -m reconcile.testing.explorer --scenario {scenario.name} "
             f"--replay \"{result.replay()}\"",
             f"  outcomes: {', '.join(result.outcomes)}", "  trace:"]
    lines += [f"    {n:>3}. {step}" for n, step in enumerate(result.trace)]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the database


@contextlib.contextmanager
def scratch_database(admin_url: str = PG_ADMIN_DEFAULT) -> Iterator[str]:
    """A throwaway migrated PostgreSQL database, dropped at the end."""
    import os

    import psycopg

    from ..db.migrate import upgrade

    name = f"explore_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1) + "/" + name
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def explore_all(scenarios: Sequence[Scenario], bounds: Bounds, *, admin_url: str = PG_ADMIN_DEFAULT,
                out: Callable[[str], None] = print, workdir: Path | None = None
                ) -> list[ScenarioReport]:
    """Explore every scenario in a scratch database; prints one line each and each violation."""
    import tempfile

    reports = []
    with scratch_database(admin_url) as url, tempfile.TemporaryDirectory() as tmp, \
            Explorer(url, workdir=workdir or Path(tmp)) as explorer, quiet_writers():
        for scenario in scenarios:
            report = explorer.explore(scenario, bounds)
            out(report.line())
            if report.first_violation is not None:
                out(describe(report.first_violation, scenario))
            reports.append(report)
    return reports


def main(argv: list[str] | None = None) -> int:
    from . import explorer_scenarios as sc

    parser = argparse.ArgumentParser(prog="python -m reconcile.testing.explorer",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", action="append", help="a scenario name (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--preemptions", type=int, default=2)
    parser.add_argument("--jumps", type=int, default=1)
    parser.add_argument("--max-schedules", type=int, default=5000, help="per scenario")
    parser.add_argument("--replay", help="run one schedule (its choice string) and print it")
    parser.add_argument("--pg-admin", default=PG_ADMIN_DEFAULT)
    parser.add_argument("--verbose", action="store_true", help="keep the library's log output")
    args = parser.parse_args(argv)
    if not args.verbose:
        logging.getLogger("reconcile").setLevel(logging.CRITICAL)
    scenarios = sc.scenarios_named(args.scenario)
    if args.list:
        for s in scenarios:
            print(f"{s.name:<40} {s.note}")
        return 0
    if args.replay is not None:
        if len(scenarios) != 1:
            parser.error("--replay needs exactly one --scenario")
        return _replay(scenarios[0], args.replay.split(), args.pg_admin)
    bounds = Bounds(args.preemptions, args.jumps, args.max_schedules)
    print(f"explorer: {len(scenarios)} scenarios, preemption bound {bounds.preemptions}, "
          f"clock-jump bound {bounds.jumps}")
    reports = explore_all(scenarios, bounds, admin_url=args.pg_admin)
    total = sum(r.schedules for r in reports)
    bad = [r for r in reports if r.violating]
    print(f"explorer: {total} schedules, {len(bad)} scenario(s) with violations")
    return 1 if bad else 0


def _replay(scenario: Scenario, choices: list[str], admin_url: str) -> int:
    import tempfile

    with scratch_database(admin_url) as url, tempfile.TemporaryDirectory() as tmp, \
            Explorer(url, workdir=Path(tmp)) as explorer, quiet_writers():
        result = explorer.run_schedule(scenario, choices)
        print(describe(result, scenario) if result.violations else
              f"scenario {scenario.name}: no violation\n  outcomes: {', '.join(result.outcomes)}\n"
              + "\n".join(f"    {n:>3}. {s}" for n, s in enumerate(result.trace)))
        if result.diverged:
            print("  (the replay diverged from the given choices)")
    return 1 if result.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
