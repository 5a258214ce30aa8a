"""Internal: the explorer's poll and finalize scenarios (see :mod:`reconcile.testing.explorer`).

An accepted job whose upstream task succeeded (or still runs): completion through the poll
chain, the webhook and the sweep against each other, a cancel, the operator and a workflow's
node wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .... import lifecycle
from ...simulator import Script
from ..common import (
    NODE_TIMEOUT,
    PARTIAL_POLICY,
    POLL_LEASE,
    REPLICATE_THRESHOLD,
    SUCCEEDS,
    SUCCEEDS_LATER,
    _pair,
    _submit,
)
from ..model import Context, Scenario
from ..writers import CANCEL, FAIL, POLL, SWEEP, WAIT, WEBHOOK


def accepted(script: Script = SUCCEEDS, *, workflow: bool = False) -> Callable[[Any, Context], None]:
    """processing / accepted, its first poll message pending (the poll writer runs it)."""
    def setup(rt: Any, ctx: Context) -> None:
        _submit(rt, ctx, script=script, workflow=workflow)
        lifecycle.create_step(rt, ctx.job_id)
        queues = ctx.explorer.queues
        ctx.facts["poll"] = queues.polls.popleft()[1:]
        queues.clear()
    return setup



POLL_SCENARIOS: tuple[Scenario, ...] = (
    # an accepted job whose upstream task succeeded: completion against everyone else
    _pair("accepted", accepted(), POLL, POLL, (POLL_LEASE,), "a duplicate poll message"),
    _pair("accepted", accepted(), POLL, SWEEP, (POLL_LEASE, REPLICATE_THRESHOLD)),
    _pair("accepted", accepted(), POLL, WEBHOOK, (POLL_LEASE,)),
    _pair("accepted", accepted(), POLL, CANCEL, (POLL_LEASE,)),
    _pair("accepted", accepted(), POLL, FAIL, (POLL_LEASE,)),
    _pair("running", accepted(SUCCEEDS_LATER), POLL, CANCEL, (POLL_LEASE,),
          "the chain's twin of batch_running:poll_due/cancel"),
    _pair("running_partial", accepted(SUCCEEDS_LATER), POLL, CANCEL, (POLL_LEASE,),
          "issue 24 finding 3: the poll reads the upstream cancel the user's cancel requested "
          "(failures keep 1/2, cancels 1/3); settled as the cancel, whichever reader wins. With "
          "the fix reverted (record_cancel_request a no-op returning True), --preemptions 1 "
          "--jumps 1: 110 schedules, 6 violating, the first at #27 (settled_off_rule: kept 20, "
          "the cancel share keeps 26; the audit is clean); 145 schedules, 0 violations with it",
          settings=PARTIAL_POLICY),
    _pair("accepted", accepted(), WEBHOOK, CANCEL, (POLL_LEASE,)),
    _pair("accepted", accepted(), SWEEP, CANCEL, (POLL_LEASE, REPLICATE_THRESHOLD)),
    _pair("accepted", accepted(), SWEEP, FAIL, (POLL_LEASE, REPLICATE_THRESHOLD)),
    _pair("workflow", accepted(workflow=True), POLL, WAIT, (NODE_TIMEOUT,),
          "hole 8: the node timeout decided on a stale read"),
    _pair("workflow", accepted(workflow=True), WEBHOOK, WAIT, (NODE_TIMEOUT,)),
)
