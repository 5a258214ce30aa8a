"""Internal: the explorer's create scenarios (see :mod:`reconcile.testing.explorer`).

A new job (pending / not_started, its create message not yet run): the create owner against
everyone who may touch a submission.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ....states import ATTEMPT_SPACING
from ...simulator import Script
from ..common import CLAIM, SUCCEEDS_LATER, _pair, _submit
from ..model import Context, Scenario
from ..writers import (
    CANCEL,
    CREATE,
    FAIL,
    RESOLVE_NOT_SUBMITTED,
    RESOLVE_UPSTREAM,
    SWEEP,
    SWEEP2,
    WEBHOOK,
)


def submitted(script: Script = SUCCEEDS_LATER) -> Callable[[Any, Context], None]:
    """pending / not_started, the create message not yet run; upstream the task will still be
    running when the create answers (so an upstream cancel is real)."""
    return lambda rt, ctx: _submit(rt, ctx, script=script)



CREATE_SCENARIOS: tuple[Scenario, ...] = (
    # a new job: the create owner against everyone who may touch a submission
    _pair("new", submitted(), CREATE, CREATE, (CLAIM,), "a duplicate create message"),
    _pair("new", submitted(), CREATE, CANCEL, (CLAIM,)),
    _pair("new", submitted(), CREATE, SWEEP, (CLAIM,)),
    _pair("new", submitted(), CREATE, SWEEP2, (CLAIM, CLAIM + ATTEMPT_SPACING),
          "hole 1 through the sweep's evidence (needs 2 jumps)"),
    _pair("new", submitted(), CREATE, RESOLVE_UPSTREAM, (CLAIM,),
          "hole 1: the late create answer vs an operator's adoption"),
    _pair("new", submitted(), CREATE, RESOLVE_NOT_SUBMITTED, (CLAIM,)),
    _pair("new", submitted(), CREATE, FAIL, (CLAIM,)),
    _pair("new", submitted(), CREATE, WEBHOOK, (CLAIM,)),
)
