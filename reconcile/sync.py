"""Internal: Sync provider calls: run by the platform's request, never by a create task.

::

    with sync_call(rt, job_id) as call:          # takes the submission claim
        call.result = client.call(model, input)  # the platform's own call
    # → completed (+ commit) or failed (+ refund at once)

A crash inside the block leaves the row ``submitting`` with ``provider_call_started_at`` set;
the sweep fails and refunds it past the kind's threshold (there is nothing to look up later).
On a platform row with no ``submission_state`` the helper only marks ``provider_kind`` and
``provider_call_started_at`` (status untouched), as a platform's own sync routes mark a call, plus
the call's claim lease (``claim_expires_at``, :func:`claim_lease`, as a library row's: the sweep
fails neither before it ends) — and only while the row is in flight with no call started
(``jobstore.platform_row_uncalled``, the claim a user cancel needs too): otherwise — a second
call, a client's retry while the first runs — it raises ``Conflict`` (409, as a library sync
job's second call) and makes no call.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from . import jobstore, lifecycle
from .db.models import Job
from .errors import Conflict, ErrorCode, InvalidParam, JobNotFound, ProviderError
from .kinds import DEADLINE_MARGIN as DEADLINE_MARGIN, Kind, check_sync_deadline
from .providers.base import SyncProvider, SyncResult
from .runtime import Runtime
from .settings import Settings
from .states import IN_FLIGHT, Status, Submission

__all__ = [
    "SyncCall", "check_sync_deadline", "run_sync", "sync_call",
]

log = logging.getLogger("reconcile.sync")

# README, Design notes: Sync calls and their deadline: a sync call's claim lease lasts the
# deadline plus the time to finish the job (store the outputs, one transaction), so the sweep
# never fails a call that is still running (the deadline leaves DEADLINE_MARGIN of its kind's
# threshold unused: kinds.check_sync_deadline)
FINISH_SLACK = timedelta(minutes=2)


def claim_lease(settings: Settings, kind: Kind) -> timedelta:
    """A sync claim covers the call's whole deadline and the finish, and at least the kind's
    threshold (a crashed request is failed + refunded once it expires)."""
    lease = max(kind.stale_threshold, timedelta(seconds=settings.sync_deadline) + FINISH_SLACK)
    return settings.scaled(lease)


@dataclass
class SyncCall:
    job_id: uuid.UUID
    token: str | None
    result: SyncResult | None = None


def claim(rt: Runtime, job_id: uuid.UUID, provider_kind: str | None) -> SyncCall:
    """The claim :func:`sync_call` takes on entry (the explorer's scenarios take it alone, as a
    request that then died)."""
    check_sync_deadline(rt.settings)  # a misconfigured deadline makes no call at all
    now = rt.now()
    with rt.sessions.begin() as session:
        job = jobstore.load(session, job_id)
        if job is None:
            raise JobNotFound()
        if job.submission_state is None:  # a platform row (README, Design notes: Platform rows)
            kind_name = provider_kind or job.provider_kind
            platform_kind = rt.kind(kind_name)
            if platform_kind is None or kind_name is None:
                raise InvalidParam(f"unknown provider_kind {kind_name!r}", param="provider_kind")
            # guarded (issue 11 hole 6): a job cancelled (and refunded) or finished meanwhile
            # must not be called for; the user cancel's CAS needs the call start NULL, so the
            # two never both win. The call holds the same claim lease as a library row's
            if not jobstore.mark_platform_call(session, job_id, kind_name, now,
                                               claim_lease(rt.settings, platform_kind)):
                raise Conflict(ErrorCode.SUBMISSION_RECONCILIATION_REQUIRED,
                               f"the job is {job.status}, not in flight: no call"
                               if job.status not in IN_FLIGHT else
                               "a provider call already started for the job: no second call")
            return SyncCall(job_id, None)
        kind = rt.kind(job.provider_kind)
        if kind is None or not kind.sync:
            raise InvalidParam("sync_call is for sync provider kinds", param="provider_kind")
        token = uuid.uuid4().hex
        if jobstore.claim_create(session, job_id, token, now, claim_lease(rt.settings, kind)) is None:
            raise Conflict(ErrorCode.SUBMISSION_RECONCILIATION_REQUIRED,
                           "the job is not waiting for its call")
        return SyncCall(job_id, token)


@contextmanager
def sync_call(rt: Runtime, job_id: uuid.UUID, *, provider_kind: str | None = None) -> Iterator[SyncCall]:
    """Claim the job, run the caller's block, then finish or fail (+ refund) the job."""
    call = claim(rt, job_id, provider_kind)
    rt.crash_point("sync_before_call")
    where = (Job.claim_token == call.token,) if call.token else ()
    try:
        yield call
    except ProviderError as exc:
        detail = exc.detail()
        if exc.request_id is not None:
            detail["upstreamRequestId"] = exc.request_id
        lifecycle.fail_job(rt, job_id, exc.code, exc.message, detail, where=where,
                           submission_state=Submission.REJECTED if call.token else None)
        raise
    except BaseException as exc:
        lifecycle.fail_job(rt, job_id, ErrorCode.UPSTREAM_FAILED, f"sync call failed: {exc!r}",
                           {"exception": type(exc).__name__}, where=where)
        raise
    rt.crash_point("sync_after_call")
    if call.result is None:
        lifecycle.fail_job(rt, job_id, ErrorCode.UPSTREAM_EMPTY_RESULT,
                           "The sync call returned no result.", None, where=where)
        return
    if not call.result.outputs:
        lifecycle.fail_job(rt, job_id, ErrorCode.UPSTREAM_EMPTY_RESULT,
                           "The provider returned no output.", None, where=where)
        return
    lifecycle.finalize_job_with_media(rt, job_id, None, source="sync", outputs=call.result.outputs)


def run_sync(rt: Runtime, job_id: uuid.UUID) -> Job:
    """Convenience: run a library-submitted sync-kind job's call with its kind's client."""
    with rt.sessions() as session:
        job = jobstore.load(session, job_id)
    if job is None:
        raise JobNotFound()
    kind = rt.kind(job.provider_kind)
    if kind is None or not kind.sync:
        raise InvalidParam("not a sync provider kind", param="provider_kind")
    client = rt.client(kind)
    assert isinstance(client, SyncProvider)
    try:
        with sync_call(rt, job_id) as call:
            call.result = client.call(job.provider_model or "", job.input_data or {})
    except ProviderError:
        pass  # recorded on the job (failed + refunded)
    with rt.sessions() as session:
        done = jobstore.load(session, job_id)
    assert done is not None
    if done.status not in (Status.COMPLETED, Status.FAILED):
        log.warning("sync_job_not_terminal job_id=%s status=%s", job_id, done.status)
    return done


from .core.facade import names_moved as _names_moved  # noqa: E402

_names_moved(__name__)
