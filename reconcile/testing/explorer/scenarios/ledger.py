"""Internal: the explorer's settlement scenarios (see :mod:`reconcile.testing.explorer`).

A failure whose refund is pending (the worker died between persisting the failure and the
refund): settle against the sweep, against another settle and, under a partial policy, against
a legacy refund's import; counted settlements checked.
"""

from __future__ import annotations

from typing import Any

from .... import lifecycle
from ...simulator import Script
from ..common import PARTIAL_POLICY, SETTLE_GRACE, _submit
from ..invariants import _count_settlements
from ..model import Context, Scenario
from ..writers import LEGACY_IMPORT, SETTLE, SWEEP


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
    # issue 24 finding 6: a partial settle keeps its share of what is held when the ledger
    # writes, a legacy refund imported meanwhile counted (failures keep 1/2)
    Scenario("unsettled_partial:settle/legacy_import", failed_unsettled,
             (SETTLE, LEGACY_IMPORT), (), extra_checks=(_count_settlements,),
             settings=PARTIAL_POLICY,
             note="issue 24 finding 6: settle racing a legacy refund's import, failures keep "
                  "1/2. With the fix reverted (settle's read of what is held without the balance "
                  "lock), --preemptions 1 --jumps 1: 24 schedules, 10 violating, the first at #5 "
                  "(kept 20 of the 30 held, the rule keeps 15); 25 schedules, 0 with it"),
)
