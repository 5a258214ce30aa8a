"""Internal: the explorer's sync-call scenarios (see :mod:`reconcile.testing.explorer`).

Sync kinds: the platform's request against the sweep, a cancel and the operator; a stray
create message for a sync job whose request died; ``sync_call`` on a platform row (after a cancel,
and twice under a partial policy).
"""

from __future__ import annotations

from typing import Any

from .... import credits, jobstore
from ....states import Status
from ..common import (
    CREDITS,
    PARTIAL_POLICY,
    SYNC_INPUT,
    SYNC_KIND,
    SYNC_THRESHOLD,
    _pair,
    _submit,
)
from ..model import START, Context, Scenario
from ..writers import CANCEL, CREATE, FAIL, SWEEP, SYNC, SYNC_PLATFORM


def sync_submitted(rt: Any, ctx: Context) -> None:
    """A sync-kind job: pending / not_started, waiting for the platform's request to call."""
    _submit(rt, ctx, kind=SYNC_KIND)


def sync_claimed_dead(rt: Any, ctx: Context) -> None:
    """A sync-kind job whose request took the submission claim, then its process died."""
    from ....sync import claim

    _submit(rt, ctx, kind=SYNC_KIND)
    claim(rt, ctx.job_id, None)


def platform_row(rt: Any, ctx: Context) -> None:
    """A platform row the library never submitted (no submission_state), credits reserved."""
    with rt.sessions.begin() as session:
        jobstore.insert_job(session, id=ctx.job_id, user_id=ctx.user_id, job_type="chat",
                            status=Status.PENDING, input_data=dict(SYNC_INPUT), progress=0,
                            created_at=START)
        session.flush()
        credits.reserve(session, ctx.user_id, ctx.job_id, CREDITS, now=START)


SYNC_SCENARIOS: tuple[Scenario, ...] = (
    # sync kinds: the platform's request against the sweep, a cancel and the operator
    _pair("sync", sync_submitted, SYNC, CANCEL, ()),
    _pair("sync", sync_submitted, SYNC, SWEEP, (SYNC_THRESHOLD,)),
    _pair("sync", sync_submitted, SYNC, FAIL, ()),
    _pair("sync_dead", sync_claimed_dead, CREATE, SWEEP, (SYNC_THRESHOLD,),
          "hole 12: a stray create message for a sync job whose request died"),
    _pair("platform", platform_row, SYNC_PLATFORM, CANCEL, (),
          "hole 6: sync_call on a platform row after a cancel"),
    _pair("platform_partial", platform_row, SYNC_PLATFORM, SYNC_PLATFORM, (SYNC_THRESHOLD,),
          "issue 24 finding 8: a client's retry while the first call runs (one paid call; "
          "failures keep 1/2, cancels 1/3)", settings=PARTIAL_POLICY),
)
