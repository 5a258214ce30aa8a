"""Internal: the explorer's vocabulary (see :mod:`reconcile.testing.explorer`).

The injected clock, the queued create/poll messages, one choice point (:class:`Decision`), what a
scenario's writers share (:class:`Context`), a writer, a scenario, the bounds and the reports.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

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



# ----------------------------------------------------------------------------- scenarios


class ExplorerView(Protocol):
    """The :class:`~.engine.Explorer` as a schedule's :class:`Context` and its scheduler
    (:mod:`.scheduler`) read it: the engine imports both, so neither imports it back."""

    sim: Any
    clock: VirtualClock
    queues: Queues
    current: Any  # the schedule running now (scheduler._Run), or None
    sim_mutations: int

    def lock_waiting(self, pid: int) -> bool: ...

    def backend(self, pid: int | None) -> Any: ...

    def terminate_backend(self, pid: int) -> None: ...


@dataclass
class Context:
    """What a scenario's setup, writers and checks share within one schedule."""

    explorer: ExplorerView
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
