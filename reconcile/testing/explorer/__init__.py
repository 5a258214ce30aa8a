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
past the settle grace, and a failed or cancelled job's exactly what the one share rule gives its
cause (``reconcile.settlement.refund_share``); ``credits.audit`` clean; no in-flight job left without a live path (only
an ``uncertain`` submission is held on purpose); no workflow execution failed solely by a node
whose job completed; no paid sync call for a cancelled job.

A scenario may carry settings (``Scenario.settings``), applied to every runtime of its schedules
— both writers' and the quiescence's — as a deployment's configuration would: the ``*_partial``
scenarios run under a partial settlement policy (failures keep 1/2, cancels 1/3).

Run it::

    python -m reconcile.testing.explorer                       # every scenario, full bounds
    python -m reconcile.testing.explorer --scenario create/resolve_upstream --replay "0 0 t0 0 1"

The package, one module a concern: :mod:`.model` (the clock, the queues, scenarios, writers,
bounds and reports), :mod:`.instrument` (which SQL statements are boundaries; the engines'
connection helpers), :mod:`.scheduler` (one schedule's writer threads: parking, granting a step,
row-lock waits), :mod:`.search` (the preemption-bounded depth-first tree of schedules),
:mod:`.engine` (:class:`Explorer`: the database, the simulator, the hooks, the snapshots, the
schedule loop) and :mod:`.cli` (the command, its output, the scratch database). The scenarios
(the writer pairs and their starting states) are in :mod:`.scenarios`, one module a flow; the
writers in :mod:`.writers`, the shared starting states in :mod:`.common`, the invariants and
quiescence in :mod:`.invariants`.
"""

from __future__ import annotations

from .cli import describe, explore_all, main, quiet_writers, scratch_database
from .engine import Explorer
from .instrument import fingerprint
from .model import (
           MAX_DECISIONS,
           PG_ADMIN_DEFAULT,
           START,
           STEP_TIMEOUT,
           Bounds,
           Context,
           Decision,
           ExplorerAbort,
           Queues,
           Scenario,
           ScenarioReport,
           ScheduleResult,
           VirtualClock,
           Writer,
           WriterFn,
)

__all__ = ["MAX_DECISIONS", "PG_ADMIN_DEFAULT", "START", "STEP_TIMEOUT", "Bounds", "Context",
           "Decision", "Explorer", "ExplorerAbort", "Queues", "Scenario", "ScenarioReport",
           "ScheduleResult", "VirtualClock", "Writer", "WriterFn", "describe", "explore_all",
           "fingerprint", "main", "quiet_writers", "scratch_database"]
