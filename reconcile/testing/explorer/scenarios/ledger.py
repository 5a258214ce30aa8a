"""Internal: the explorer's settlement scenarios (see :mod:`reconcile.testing.explorer`).

A failure whose refund is pending (the worker died between persisting the failure and the
refund): settle against the sweep and against another settle, counted settlements checked.
"""

from __future__ import annotations

from typing import Any

from .... import lifecycle
from ...simulator import Script
from ..common import SETTLE_GRACE, _submit
from ..invariants import _count_settlements
from ..model import Context, Scenario
from ..writers import SETTLE, SWEEP


class _Crash(Exception):
    """A worker dying at a named crash point during setup (the state it leaves is the start)."""


def failed_unsettled(rt: Any, ctx: Context) -> None:
    """failed, refund pending: the worker died between persisting the failure and the refund."""
    _submit(rt, ctx, script=Script(timeline=((0.0, "failed"),)))
    lifecycle.create_step(rt, ctx.job_id)
    generation, seq = ctx.explorer.queues.polls.popleft()[1:]

    def crash(point: str) -> None:
        if point == "before_refund":
            raise _Crash(point)
    rt.crash_hook = crash
    try:
        lifecycle.poll_step(rt, ctx.job_id, generation, seq)
    except _Crash:
        pass
    finally:
        rt.crash_hook = None
    ctx.explorer.queues.clear()


LEDGER_SCENARIOS: tuple[Scenario, ...] = (
    # a failure whose refund is pending
    Scenario("unsettled:settle/sweep", failed_unsettled, (SETTLE, SWEEP), (SETTLE_GRACE,),
             extra_checks=(_count_settlements,)),
    Scenario("unsettled:settle/settle", failed_unsettled, (SETTLE, SETTLE), (),
             extra_checks=(_count_settlements,)),
)
