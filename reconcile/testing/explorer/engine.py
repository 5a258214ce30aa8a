"""Internal: the explorer itself (see :mod:`reconcile.testing.explorer`).

:class:`Explorer` owns the scratch database, the simulator, the writers' engines and their hooks,
restores each scenario's starting state from a snapshot, runs one schedule and explores a
scenario's tree of schedules within the bounds.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from .instrument import (
    _SKIP,
    _WRITE,
    _backend_pid,
    _fast_deadlocks,
    _outbox_only,
    _plain,
    fingerprint,
)
from .model import (
    _LOCK_POLL,
    MAX_DECISIONS,
    START,
    STEP_TIMEOUT,
    Bounds,
    Context,
    Decision,
    Queues,
    Scenario,
    ScenarioReport,
    ScheduleResult,
    VirtualClock,
)
from .scheduler import _Run, expected_raise
from .search import _available, _bind, _children, _default

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



# wakes of the sleeping writers that changed nothing before the world moves (Explorer._world_moves)
IDLE_WAKES = 3


class Explorer:
    """Owns the database, the simulator, the engines and the hooks; runs schedules."""

    def __init__(self, database_url: str, *, workdir: Path, sim: Any | None = None) -> None:
        from sqlalchemy import event

        from ...db.models import JobEvent
        from ...db.session import make_engine, make_sessionmaker
        from ..simulator import Simulator

        self.database_url = database_url
        self.workdir = workdir
        self.clock = VirtualClock()
        self.queues = Queues()
        self.current: _Run | None = None
        self._snapshots: dict[str, _Snapshot] = {}
        self._outbox = JobEvent.__tablename__
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

        from ...runtime import Runtime
        from ...storage import LocalStorage

        # a scenario's writers step the poll chain's turns unless it says otherwise (the batch
        # scenarios carry poll_mode=batch: scenarios/batch.py)
        return Runtime(
            settings=self.sim.settings(webhook_base_url="https://platform.example/hooks",
                                       database_url=self.database_url, poll_mode="chain"),
            sessions=sessions, storage=LocalStorage(self.workdir / "media"), clock=self.clock,
            http=requests.Session(),  # kept-alive loopback connections: media fetches are cheap
            enqueue_create=self.queues.enqueue_create, enqueue_poll=self.queues.enqueue_poll)

    # --- hooks (writer threads) -----------------------------------------------------------------

    def _on_execute(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                    executemany: bool) -> None:
        run = self.current
        slot = run.slot_here() if run is not None else None
        if run is None or slot is None:
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
        if run is not None and slot is not None and dirty:
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
        from ...db.models import Base

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
        from .common import fund

        ctx = Context(self, uuid.uuid5(uuid.NAMESPACE_URL, f"explorer/{scenario.name}/job"),
                      uuid.uuid5(uuid.NAMESPACE_URL, "explorer/user"))
        settings = self._base_settings.model_copy(update=dict(scenario.settings))
        for rt in (self.rt, *self.writer_rts):
            rt.settings = settings
        snapshot = self._snapshots.get(scenario.name)
        if snapshot is None:
            self.reset()
            fund(self.rt, ctx)
            scenario.setup(self.rt, ctx)
            self._snapshots[scenario.name] = self._snapshot(ctx)
        else:
            self._restore(snapshot, ctx)
        return ctx

    def _snapshot(self, ctx: Context) -> _Snapshot:
        import copy

        from ...db.models import Base

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

        from ...db.models import Base

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
        from .invariants import check, quiesce_and_check

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
            idle = 0  # wakes of sleepers with no change since (nothing moved the world)
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
                        elif idle >= IDLE_WAKES and run.all_asleep():
                            self._world_moves(run, ctx, trace)
                            idle = 0
                        else:
                            run.touch()
                            idle += 1
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
                    before = run.version
                    run.step(index)
                    if run.version != before:  # it committed a change: not idle
                        idle = 0
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
        violations = [f"unexpected raise: {s.name} raised {type(s.error).__name__}: {s.error}"
                      for s in run.slots if s.error is not None and not expected_raise(s.error)]
        violations += check(self.rt, ctx, scenario, "after writers")
        if not any(v.startswith("hang") for v in violations):
            violations += quiesce_and_check(self.rt, ctx, scenario)
        return ScheduleResult(tuple(d.chosen for d in decisions), tuple(trace), tuple(violations),
                              outcomes, tuple(decisions), diverged)

    def _world_moves(self, run: _Run, ctx: Context, trace: list[str]) -> None:
        """Every writer left waits for time, no mark is ahead, and waking them changed nothing
        (``IDLE_WAKES`` times): the rest of the world moves as at quiescence — workers run the
        queued messages, time passes to the job's next deadline. Without it a waiter on what only
        a queued message would do (a webhook that enqueued a poll, a workflow's wait) spins at
        one instant until the step limit: a hang of the harness, not of the library."""
        from ... import jobstore
        from .invariants import _drain, _next_deadline

        _drain(self.rt, ctx)
        with self.rt.sessions() as session:
            job = jobstore.load(session, ctx.job_id)
        if job is not None:
            self.clock.now = max(self.clock.now, _next_deadline(self.rt, job, self.clock.now))
        run.touch()
        trace.append(f"world: queued messages run; clock → +{self.clock.now - START} "
                     "(all waiting, nothing changed)")

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
