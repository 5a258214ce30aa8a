"""Internal: the library's own mechanics, not an import path for platforms (may move).

``python -m reconcile.demo`` (also ``reconcile demo``): the whole crash-and-money story, end
to end, on one machine with no database or broker server, in well under 90 seconds.

What runs (all on loopback, all cleaned up — process groups killed — even on failure):

* an SQLite file, the ``filesystem://`` Celery broker and local-folder storage in a fresh work
  folder (``./demo-run/``, wiped at start);
* the provider simulator (a thread of this process) and the platform's webhook endpoint (another
  thread, calling :func:`reconcile.webhook_ingest.handle_webhook`);
* real ``celery -A reconcile.celery_app worker --pool=prefork -c 2`` subprocesses, each in its own
  process group;
* a stand-in for the platform's request process (a subprocess of this module, ``--request``) that
  runs the sync kinds through :func:`reconcile.sync.run_sync`.

``RECONCILE_TIME_SCALE`` (default 0.05 here) multiplies every threshold, interval and lease, and
the simulator plays its timelines at the same scale, so one provider minute takes 3 s: the 5-min
sync threshold becomes 15 s, a KIE poll lease (2 × 5 s + 30 s) 2 s. Poll intervals shrink too
(Replicate/fal every 0.15 s); at 0.02 (``--time-scale 0.02``, ~17 s) the 0.8 s leases are shorter
than a busy worker's scheduling jitter, so the sweep also "resumes" chains that were merely late —
harmless (the stale chain is fenced) but it blurs the story, hence 0.05.

The story, on a mixed batch of 20 jobs (KIE market, KIE Veo, Replicate, ElevenLabs dubbing, fal
queue, and the sync kinds anthropic-sync / kie-llm), told in the configured poll mode
(``Settings().poll_mode``, i.e. ``RECONCILE_POLL_MODE`` or the library's default, passed to every
process explicitly). Steps 1 and 2 depend on it:

1. *chain*: worker A does the creates and starts the poll chains. Once every create is decided,
   its ``mid_poll`` crash point is armed (``RECONCILE_TEST_CRASH_AT=mid_poll`` with a once-only
   marker file that exists — disarmed — until the demo deletes it) and worker A SIGKILLs its
   whole process group in the middle of a poll. The ``filesystem://`` broker never redelivers
   after a whole-worker crash: the poll messages A held (ETA countdowns, the one it was running)
   are gone.

   *batch*: worker A does the creates; the accepted rows carry their due times, and
   ``reconcile.poll_due`` claims and reads them in batches on the workers. Once every create
   is decided, the once-only ``mid_batch`` crash is armed the same way, and worker A SIGKILLs
   its whole process group right after a claim committed, before reading it. The demo notes
   which rows A's processes (their ``reconcile_workers`` liveness ids) then hold claimed
   (``jobs.claimed_by``, ``poll_due_at`` = ``poll_lease_expires_at`` still ahead).
2. *chain*: worker B starts. Nothing hands it A's work except the library's own state: each
   dead chain's poll lease expires, and the sweep resumes it under a new generation
   (``sweep-resumed``).

   *batch*: worker B starts. A's claimed rows come back without any message: ``released`` when
   a reaper (worker B's heartbeat thread, or the sweep tick) sees A's heartbeat lapse and ends
   its claims at once, ``due-again`` when the claim lease runs out first; B claims them and
   finishes them (the invariant: every row A held claimed at its death ends completed or
   failed-and-refunded, last claimed by one of B's processes).
3. One create's connection drops after the provider accepted it (``Script(create=
   "drop_after_accept")``): the job is ``uncertain``, keeps its reservation, is never resubmitted,
   and is left for an operator (shown with ``python -m reconcile uncertain``).
4. One task fails upstream: failed with ``UPSTREAM_FAILED`` and refunded.
5. One sync call's request process is SIGKILLed right after the provider answered
   (``RECONCILE_TEST_CRASH_AT=sync_after_call``): the row stays ``submitting``; past the kind's
   threshold the sweep fails it ``RECONCILE_NO_RECOVERY`` and refunds it.
6. Everything else completes, some through signed webhooks.

**The sweep driver.** This process calls :func:`reconcile.sweep.sweep` every
``SWEEP_INTERVAL × TIME_SCALE`` seconds (a thread), rather than running ``celery beat``. Why:
(a) the story has a window in which *no* worker is alive (A dead, B starting); a beat tick sent
to the ``reconcile.sweep`` queue would wait in the broker until B is up (or expire), whereas an
in-process tick keeps deciding and queues the resumed chains for B; (b) the demo prints each
tick's ``[reconcile] …`` line from the returned report instead of scraping worker logs; (c) one
fewer process to start. It is the same function the ``reconcile.sweep`` task runs, with the same
fan-out (``reconcile.reconcile_job`` on the workers) past the tick's time budget, so recovery
does not depend on the driver; production runs it from one ``celery beat``.

**The poll_due driver** (batch mode). Likewise, a thread of this process sends
``reconcile.poll_due`` every ``Settings.poll_due_tick`` interval with its expiry, through the
library's own send, as beat's ``reconcile-poll-due`` entry would; the claims and the reads run
on the workers. The ``filesystem://`` broker has no message TTL: ticks sent while no worker is
alive stay on disk, and the worker that receives them after their expiry drops them unrun (the
report counts them). Each worker process's own fallback tick (``reconcile.worker.ticker``)
runs beside it.

It prints the story as it happens, a table per job (outcome, error code, upstream creates from
the simulator's counters, credits reserved / committed / refunded, how it was settled), the sweep
tick lines, the operator view of the uncertain job and the ledger audit, and exits 0 only if every
invariant holds (:func:`check` per job, :func:`report` for the run). "Settled by": ``worker`` (its
first poll chain — whose first turn the sweep may have sent again, when it was lost before it
ran), ``sweep-resumed`` (a chain the sweep restarted), ``webhook``, ``sweep-poll``
(the sweep's own read past the threshold), ``request`` (a sync call), ``refunded-by-sweep``,
``left-uncertain``. In batch mode a row's generation says nothing about the sweep (a webhook's
confirmed success starts one too): ``worker`` (read and finished by a worker's batch poller),
``released`` and ``due-again`` (a row worker A held claimed when it died, as above) replace the
first two.

With ``RECONCILE_DATABASE_URL`` (e.g. PostgreSQL) and/or ``RECONCILE_BROKER_URL`` (e.g. Redis)
set, the demo uses them instead: the database is migrated but never wiped, and only this run's
jobs and users are counted. The sweep still acts on every row of that database, as it would in
production (stale rows of other runs get failed and refunded): point it at a scratch database.

The package, one module a part of the story: :mod:`.plan` (the batch, the grants, the story's
record), :mod:`.processes` (the subprocesses, the work folder and environment, the webhook
endpoint, the sweep driver and the poll_due driver), :mod:`.story` (the run itself, the request
process, ``main``), :mod:`.claims` (the batch story's evidence: A's claims at its death, their
release), :mod:`.checks` (the invariants) and :mod:`.report` (the operator view, the table, the
totals).
"""

from __future__ import annotations

from .checks import check, run_failures
from .plan import GRANTS, Planned, Row, Story, batch
from .report import how_settled, print_table, report
from .story import main, request_process, run

__all__ = ["GRANTS", "Planned", "Row", "Story", "batch", "check", "how_settled", "main",
           "print_table", "report", "request_process", "run", "run_failures"]
