"""Internal: the explorer's shared starting state (see :mod:`reconcile.testing.explorer`).

The kinds, models, prices and upstream scripts the scenarios use, the deadlines a clock jump may
pass, the user's grant every scenario starts from, the submission every starting state is built
on with the real lifecycle, and the pairing of two writers into a scenario.

Providers are the shipped simulator over loopback (Replicate for the async kinds: it has a cancel
endpoint and a listing, so evidence and upstream cancels are real; Anthropic for the sync kinds).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from fractions import Fraction
from typing import Any

from ... import credits, lifecycle
from ...db.models import WorkflowExecution
from ...states import CREATE_CLAIM_LEASE
from ..simulator import Script
from .model import START, Context, Scenario, Writer

ASYNC_KIND, ASYNC_MODEL, ASYNC_INPUT = "replicate-prediction", "owner/model:abc123", {"prompt": "x"}
SYNC_KIND, SYNC_MODEL, SYNC_INPUT = "anthropic-sync", "claude-sonnet-4-5", {"prompt": "hi"}
CREDITS = 40
LEGACY_REFUND = 10  # what the legacy-import writer says the platform's old code gave back
NODE = "n1"
SUCCEEDS = Script(timeline=((0.0, "succeeded"),))  # done upstream at once
SUCCEEDS_LATER = Script(timeline=((0.0, "running"), (10.0, "succeeded")))

# deadlines, as offsets from the schedule's start (the explorer passes each by one second)
CLAIM = CREATE_CLAIM_LEASE
POLL_LEASE = timedelta(seconds=21)  # replicate: 2 × 3 s + 15 s slack
SETTLE_GRACE = timedelta(seconds=30)
NODE_TIMEOUT = timedelta(minutes=90)
REPLICATE_THRESHOLD = timedelta(minutes=20)
SYNC_THRESHOLD = timedelta(minutes=5)

# a partial settlement policy (deployment configuration: RECONCILE_FAILURE_REFUND=1/2,
# RECONCILE_CANCEL_REFUND=1/3), as a scenario's settings: every runtime of the scenario (both
# writers', the quiescence's) settles with it, and the final checks hold each settlement to it
PARTIAL_POLICY: tuple[tuple[str, Any], ...] = (("failure_refund", Fraction(1, 2)),
                                               ("cancel_refund", Fraction(1, 3)))


# ----------------------------------------------------------------------------- setups


def fund(rt: Any, ctx: Context) -> None:
    with rt.sessions.begin() as session:
        credits.grant(session, ctx.user_id, "sub", 1000, "explorer-grant", now=START)


def _submit(rt: Any, ctx: Context, *, kind: str = ASYNC_KIND, script: Script = SUCCEEDS,
            workflow: bool = False) -> None:
    model, input_ = (SYNC_MODEL, SYNC_INPUT) if kind == SYNC_KIND else (ASYNC_MODEL, ASYNC_INPUT)
    ctx.sim.script(str(ctx.job_id), script)
    execution = None
    if workflow:
        execution = uuid.uuid5(ctx.job_id, "execution")
        with rt.sessions.begin() as session:
            session.add(WorkflowExecution(id=execution, status="running", failed_nodes=[]))
    lifecycle.submit_job(rt, ctx.user_id, kind, model, input_, CREDITS, job_type="image",
                         job_id=ctx.job_id, workflow_execution_id=execution,
                         node_id=NODE if workflow else None)
    ctx.explorer.queues.clear()  # the writers are the workers now



def _pair(state: str, setup: Callable[[Any, Context], None], a: Writer, b: Writer,
          marks: tuple[timedelta, ...], note: str = "",
          settings: tuple[tuple[str, Any], ...] = ()) -> Scenario:
    return Scenario(f"{state}:{a.name}/{b.name}", setup, (a, b), marks, note=note,
                    settings=settings)
