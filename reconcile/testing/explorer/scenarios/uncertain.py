"""Internal: the explorer's uncertain-submission scenarios (see
:mod:`reconcile.testing.explorer`).

A create whose answer was lost after the provider accepted it: the sweep's evidence, a webhook
and a cancel against the operator's resolve.
"""

from __future__ import annotations

from typing import Any

from .... import lifecycle
from ....states import ATTEMPT_SPACING
from ...simulator import Script
from ..common import _pair, _submit
from ..model import Context, Scenario
from ..writers import CANCEL, RESOLVE_NOT_SUBMITTED, RESOLVE_UPSTREAM, SWEEP, WEBHOOK


def uncertain(rt: Any, ctx: Context) -> None:
    """pending / uncertain: the connection dropped after the provider accepted the create."""
    _submit(rt, ctx, script=Script(timeline=((0.0, "succeeded"),), create="drop_after_accept"))
    lifecycle.create_step(rt, ctx.job_id)
    ctx.explorer.queues.clear()


UNCERTAIN_SCENARIOS: tuple[Scenario, ...] = (
    # an uncertain submission: evidence against the operator
    _pair("uncertain", uncertain, SWEEP, RESOLVE_UPSTREAM, (ATTEMPT_SPACING,)),
    _pair("uncertain", uncertain, SWEEP, RESOLVE_NOT_SUBMITTED, (ATTEMPT_SPACING,)),
    _pair("uncertain", uncertain, RESOLVE_UPSTREAM, RESOLVE_NOT_SUBMITTED, ()),
    _pair("uncertain", uncertain, WEBHOOK, RESOLVE_NOT_SUBMITTED, ()),
    _pair("uncertain", uncertain, CANCEL, RESOLVE_UPSTREAM, ()),
)
