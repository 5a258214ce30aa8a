"""Internal: the library's own mechanics, not an import path for platforms (may move).

A seeded chaos run: N jobs through real Celery workers, with faults, checked against invariants.

Deterministic simulation testing, as far as real processes allow: the seed derives every job (id,
kind, script, price, submit time) and the whole fault schedule (which worker is SIGKILLed when,
when the scratch Redis restarts, when PostgreSQL backends are terminated, the simulator's chaos
knobs). The same seed replays the same schedule; only timing noise differs. Run it::

    python -m reconcile.testing.chaos --jobs 300 [--seed S]      # or: make chaos N=300

What runs: a fresh PostgreSQL database, a ``redis-server`` this harness starts on a free port (the
broker and the events pub/sub; no persistence, so a restart loses every queued message), the
provider simulator with random latency and failures, a webhook receiver, two ``celery worker``
processes, the platform side in this process (submitting jobs, running the sync kinds' calls) and
two sweepers ticking on overlapping schedules (the second past its time budget at every tick, as
on a backlog: its rows fanned out, or in batch mode handed to the batch poller). At the end, with the faults over and the system
given time to settle, the invariants are checked:

* no worker exited unless the schedule killed it, and no live worker stopped consuming (no task
  received for ``STALL_SECONDS`` while messages waited): checked while the run goes on;
* no job was created upstream twice; no job was settled twice; the ledger audit is clean;
* every job is terminal and settled, except ``uncertain`` ones (listed: never auto-refunded);
* every asset row's object exists; a completed job has exactly one asset row per output (and only
  after its upstream task succeeded); every outbox event was published;
* every settled job kept exactly the one share rule's part of what it reserved
  (:mod:`.policy`: ``--policy FAILURE,CANCEL``, drawn from the seed when not given, set in every
  process), and the platform's own rows mixed in — of an unregistered kind and of the run's
  observe-only kind — were left alone (:mod:`.platform_rows`);
* storage objects no asset row names (orphans) are counted and reported, not a violation.

The report goes to stdout; the exit status is 1 on any violation. The processes it drives come
from :mod:`reconcile.testing.processes`.

The package, one module a concern: :mod:`.plan` (the seeded plan: jobs and the fault
schedule), :mod:`.control` (process control: the workers, the faults firing, the watchdog),
:mod:`.run` (the run: submit, sweep, settle; ``main``), :mod:`.shape` (the database's time zone
and naive platform tables), :mod:`.policy` (the settlement policy and its check),
:mod:`.platform_rows` (the platform's own rows and their check), :mod:`.checks` (the invariants
over the quiescent end state) and :mod:`.report` (:class:`ChaosReport` and its text).
"""

from __future__ import annotations

from .control import ChaosConfig
from .plan import FAMILIES, SYNC_KINDS, Fault, JobSpec, Plan, make_plan
from .report import ChaosReport
from .run import main, run

__all__ = ["FAMILIES", "SYNC_KINDS", "ChaosConfig", "ChaosReport", "Fault", "JobSpec", "Plan",
           "main", "make_plan", "run"]
