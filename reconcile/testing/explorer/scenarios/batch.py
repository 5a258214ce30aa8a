"""Internal: the explorer's batch-polling scenarios (see :mod:`reconcile.testing.explorer`).

``RECONCILE_POLL_MODE=batch`` (issue 16): the batch poller against everyone who touches a
polled job.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .... import jobstore, lifecycle
from ...simulator import Script
from ..common import REPLICATE_THRESHOLD, SUCCEEDS, SUCCEEDS_LATER, _submit
from ..model import Context, Scenario
from ..writers import CANCEL, POLL_DUE, SWEEP, SWEEP_OVER, WEBHOOK

# RECONCILE_POLL_MODE=batch: reads inline (one thread) so the writer's steps stay its own
BATCH = (("poll_mode", "batch"), ("poll_batch_threads", 1))
# a batch claim's lease: a status read's total deadline (4 × 35 s + 3 × 30 s) + 15 s slack
BATCH_LEASE = timedelta(seconds=245)


def batch_accepted(script: Script = SUCCEEDS) -> Callable[[Any, Context], None]:
    """processing / accepted in batch mode: no poll message, the row due now (poll_due_at)."""
    def setup(rt: Any, ctx: Context) -> None:
        _submit(rt, ctx, script=script)
        lifecycle.create_step(rt, ctx.job_id)
        assert not ctx.explorer.queues.polls, "batch mode sends no poll message"
        with rt.sessions.begin() as session:
            jobstore.make_due_at(session, ctx.job_id, ctx.clock.now)
        ctx.explorer.queues.clear()
    return setup


def batch_dead_chain(script: Script = SUCCEEDS) -> Callable[[Any, Context], None]:
    """processing / accepted with no due time and its poll lease ended: a chain that died
    before the deployment moved to batch mode (the sweep resumes it by making it due)."""
    def setup(rt: Any, ctx: Context) -> None:
        _submit(rt, ctx, script=script)
        lifecycle.create_step(rt, ctx.job_id)
        with rt.sessions.begin() as session:
            jobstore.unschedule(session, ctx.job_id, ctx.clock.now)
        ctx.explorer.queues.clear()
    return setup


BATCH_SCENARIOS: tuple[Scenario, ...] = (
    # batch polling (issue 16): the batch poller against everyone who touches a polled job
    *(Scenario(f"{state}:poll_due/{b.name}", setup, (POLL_DUE, b), marks, settings=BATCH,
               note=note)
      for state, setup, b, marks, note in (
          ("batch", batch_accepted(), POLL_DUE, (BATCH_LEASE,),
           "two pollers: SKIP LOCKED claims; a claim taken over past its lease is fenced"),
          ("batch", batch_accepted(), WEBHOOK, (BATCH_LEASE,), ""),
          ("batch", batch_accepted(), CANCEL, (BATCH_LEASE,), ""),
          ("batch", batch_accepted(), SWEEP, (BATCH_LEASE, REPLICATE_THRESHOLD), ""),
          ("batch_running", batch_accepted(SUCCEEDS_LATER), POLL_DUE, (BATCH_LEASE,),
           "the set-based still-running write under two pollers"),
          ("batch_running", batch_accepted(SUCCEEDS_LATER), CANCEL, (BATCH_LEASE,), ""),
      )),
    # a tick past its budget hands dead chains to the batch poller (made due, set-based)
    *(Scenario(f"{state}:{SWEEP_OVER.name}/{b.name}", setup, (SWEEP_OVER, b), marks,
               settings=BATCH, note=note)
      for state, setup, b, marks, note in (
          ("batch_dead_chain", batch_dead_chain(), POLL_DUE, (REPLICATE_THRESHOLD, BATCH_LEASE),
           "the row made due by the tick, read by the poller"),
          ("batch_dead_chain", batch_dead_chain(), WEBHOOK, (REPLICATE_THRESHOLD,), ""),
          ("batch_dead_chain", batch_dead_chain(), CANCEL, (REPLICATE_THRESHOLD,), ""),
          ("batch_dead_chain", batch_dead_chain(), SWEEP_OVER, (REPLICATE_THRESHOLD,),
           "two ticks past their budget: SKIP LOCKED pages, one make-due"),
      )),
)
