"""Internal: uncertain jobs — adopt the upstream id from evidence, or resolve as not submitted.
"""

from __future__ import annotations

import logging
import uuid

from .. import jobstore
from ..db.models import Job
from ..errors import ErrorCode
from ..jobstore import evidence
from ..jobstore.events import add_event, publish_events
from ..runtime import Runtime
from ..states import Submission
from .create import usable_task_id
from .poll import _batch_mode, poll_lease
from .settling import fail_job

log = logging.getLogger("reconcile.lifecycle")


def adopt_upstream_id(rt: Runtime, job_id: uuid.UUID, task_id: str, *, source: str) -> bool:
    """Evidence found (a webhook, a provider listing, an operator): an ``uncertain`` (or expired
    ``submitting``) job takes the upstream id, becomes ``accepted``/``processing`` with attempts
    reset, and its poll chain starts. False: the job is not waiting for evidence any more, or
    another job already holds ``task_id`` (it is that job's task:
    :func:`reconcile.jobstore.evidence.held_elsewhere`, whatever the source: the sweep, a listing
    or an operator)."""
    now = rt.now()
    with rt.sessions.begin() as session:
        job = jobstore.load(session, job_id)
        kind = rt.kind(job.provider_kind) if job else None
        if job is None or kind is None or kind.sync or not usable_task_id(task_id):
            return False
        evidence.lock_upstream_id(session, task_id)  # one adoption of an id at a time
        if evidence.held_elsewhere(session, [task_id], job_id):
            log.warning("adopt_refused_held_elsewhere job_id=%s task_id=%s source=%s", job_id,
                        task_id, source)
            return False
        adopted = jobstore.adopt_task_id(
            session, job_id, task_id, now, poll_lease_until=now + poll_lease(rt, kind),
            poll_due_at=now if _batch_mode(rt) else None, source=source)
        if adopted is None:
            return False
        running = add_event(session, adopted, "running", now,
                            {"provider_task_id": task_id, "adopted_from": source}, rt=rt)
    publish_events(rt, [running])
    log.info("uncertain_adopted job_id=%s task_id=%s source=%s", job_id, task_id, source)
    if not _batch_mode(rt):
        rt.enqueue_poll(job_id, adopted.poll_generation, 0, 0.0)
    return True


def resolve_not_submitted(rt: Runtime, job_id: uuid.UUID, *, reason: str = "operator") -> bool:
    """An operator established that nothing was created upstream: fail + refund."""
    return fail_job(
        rt, job_id, ErrorCode.RECONCILE_NO_RECOVERY, "reconcile_no_recovery",
        {"resolved": "not_submitted", "by": reason, "submissionOutcome": "rejected"},
        submission_state=Submission.REJECTED,
        where=(Job.submission_state.in_([Submission.UNCERTAIN, Submission.SUBMITTING]),
               Job.provider_task_id.is_(None),
               # a live claim means a worker may be creating right now: not for an operator
               jobstore.uncertain_expired(rt.now())),
    )
