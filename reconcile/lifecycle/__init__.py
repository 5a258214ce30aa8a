"""Internal: The job lifecycle: submit → create (claim) → poll → finalize | fail → settle; cancel.

Each step is a plain function over a :class:`~reconcile.runtime.Runtime` and a job id; the Celery
tasks are thin wrappers. State changes are compare-and-set writes (``jobstore``); a step that
loses one does nothing more. Upstream creates happen only after winning the submission claim,
and a persisted task id is always resumed, never re-created.

The steps live in private submodules, one per seam: ``submit``, ``create`` (claim, create, the
task id's save, late answers, rate limits), ``poll`` (leases, the chain's turn, observe,
unfinished attempts, exhaustion), ``finalize`` (media, completion, workflow reopen), ``settling``
(fail and settle) and ``adopt`` (uncertain jobs: adoption, resolved as not submitted). Import
from this package; a test that patches a step's collaborator patches the submodule that looks
it up (``reconcile.lifecycle.poll.read_status``), since a name set here reaches only the
callers that go through the package.
"""

from __future__ import annotations

from .adopt import adopt_upstream_id, resolve_not_submitted
from .create import CreateOutcome, create_step, on_task_created, usable_task_id as usable_task_id
from .finalize import finalize_job_with_media as finalize_job_with_media
from .poll import (
    _unfinished as _unfinished,
    exhaust as exhaust,
    observe,
    outputs_to_store as outputs_to_store,
    past_threshold as past_threshold,
    poll_countdown as poll_countdown,
    poll_lease as poll_lease,
    poll_step,
    poll_step_deadline,
    read_status,
    reader_claim as reader_claim,
    resume_chain,
    storing_hold as storing_hold,
)
from .settling import fail_job, settle
from .submit import Submitted, submit_job

# The names imported ``as`` themselves are kept out of ``__all__``: sibling modules use them,
# platforms do not (``_unfinished`` is the batch poller's: reconcile.lifecycle.batch counts its
# attempts with the chain's own rules).
__all__ = [
    "CreateOutcome", "Submitted", "adopt_upstream_id", "create_step", "fail_job", "observe",
    "on_task_created", "poll_step", "poll_step_deadline", "read_status",
    "resolve_not_submitted", "resume_chain", "settle", "submit_job",
]
