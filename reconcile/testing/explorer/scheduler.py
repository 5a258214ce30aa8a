"""Internal: the explorer's scheduler of one schedule (see :mod:`reconcile.testing.explorer`).

Each writer runs in its own thread and parks at every boundary; :class:`_Run` grants one step at a
time, tells a writer waiting on a row lock (through PostgreSQL's lock graph, never by timing) from
one that runs, and wakes sleepers when committed state or the clock changed.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .model import _LOCK_GRACE, _LOCK_POLL, STEP_TIMEOUT, ExplorerAbort, ExplorerView

# ----------------------------------------------------------------------------- one schedule


def expected_raise(exc: BaseException) -> bool:
    """Whether a writer's raise is an outcome the invariants judge, not a violation by itself:
    the library's own errors (a conflict, a provider error, a ledger refusal) and a database
    error (a lock timeout, a serialization failure, a terminated backend: the caller's retry
    owns it). Anything else (an ImportError, a TypeError, an AttributeError, an assert) is a bug
    in the code under test, and the schedule reports it."""
    from sqlalchemy.exc import DBAPIError

    from ...errors import ReconcileError

    return isinstance(exc, ReconcileError | DBAPIError)


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



class _Run:
    """The scheduler of one schedule: parks writer threads, grants steps, detects lock waits."""

    def __init__(self, explorer: ExplorerView, writers: Sequence[tuple[str, Callable[[], str]]]) -> None:
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
        except BaseException as exc:  # an outcome; one the library never raises is a violation
            # (engine: ``expected_raise``)
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

    def all_asleep(self) -> bool:
        """Every writer not done is asleep (none runs, none waits on a lock)."""
        with self.cond:
            return all(s.state in ("sleeping", "done") for s in self.slots)

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
