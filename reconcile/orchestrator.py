"""Internal: Waiting on a job from a workflow orchestrator (README, Design notes: Orchestrators).

:func:`wait_for_job` polls ``jobs.status`` (every 3 s by default) with the node timeout raised
from 30 to 90 minutes, which covers every legitimate poll budget (``kie-lip-sync`` ≈ 60 min).
At the timeout it fails the *node* — ``workflow_executions.failed_nodes`` gains the node id and
the execution becomes ``failed`` — and raises :class:`NodeTimeout`, but it leaves the *job* in
flight (a cancelled job cannot complete, so the sole-cause reopen could never fire). A late
completion then reopens the execution when this node was its sole cause
(``lifecycle.finalize_job_with_media`` → ``_reopen_workflow``, CAS on ``failed``).

The execution write never overrides a user's cancel (CAS ``status <> 'cancelled'``) and never touches an execution that already completed.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from .db.models import Job, WorkflowExecution
from .errors import JobNotFound, ReconcileError
from .runtime import Runtime
from .states import TERMINAL

__all__ = [
    "NODE_TIMEOUT", "NodeTimeout", "POLL_INTERVAL", "wait_for_job",
]

log = logging.getLogger("reconcile.orchestrator")

NODE_TIMEOUT = timedelta(minutes=90)
POLL_INTERVAL = 3.0  # seconds
# execution states a node timeout leaves alone (any other status may become ``failed``)
_SETTLED_EXECUTION = ("cancelled", "canceled", "completed")


class NodeTimeout(ReconcileError):
    """The workflow node timed out waiting for its job (the job itself is still in flight)."""

    def __init__(self, job_id: uuid.UUID, node_id: str | None,
                 execution_id: uuid.UUID | None, waited: timedelta) -> None:
        super().__init__(f"node {node_id or '?'} timed out after {_minutes(waited)} waiting for "
                         f"job {job_id}")
        self.job_id = job_id
        self.node_id = node_id
        self.execution_id = execution_id
        self.waited = waited


def wait_for_job(
    rt: Runtime,
    job_id: uuid.UUID,
    *,
    node_timeout: timedelta = NODE_TIMEOUT,
    interval: float = POLL_INTERVAL,
    clock: Callable[[], datetime] | None = None,
    sleep: Callable[[float], Any] = time.sleep,
) -> str:
    """Poll the job until it is terminal and return its status (``completed``, ``failed`` or
    ``cancelled``). At ``node_timeout`` mark the node failed and raise :class:`NodeTimeout`.

    ``clock`` (default ``rt.clock``) and ``sleep`` are injected so tests run 90 minutes at once.
    """
    clock = clock or rt.clock
    started = clock()
    deadline = started + node_timeout
    while True:
        status = _status(rt, job_id)
        if status in TERMINAL:
            return status
        now = clock()
        if now >= deadline:
            break
        sleep(max(0.0, min(interval, (deadline - now).total_seconds())))
    waited = clock() - started
    finished, node_id, execution_id = _time_out_node(rt, job_id, waited)
    if finished is not None:  # it finished after our last read: not a timeout (issue 11 hole 8)
        return finished
    log.warning("node_timeout job_id=%s node_id=%s execution_id=%s waited_s=%d", job_id, node_id,
                execution_id, waited.total_seconds())
    raise NodeTimeout(job_id, node_id, execution_id, waited)


def _status(rt: Runtime, job_id: uuid.UUID) -> str:
    with rt.sessions() as session:
        status = session.execute(select(Job.status).where(Job.id == job_id)).scalar_one_or_none()
    if status is None:
        raise JobNotFound()
    return status


def mark_node_timed_out(rt: Runtime, job_id: uuid.UUID,
                        waited: timedelta = NODE_TIMEOUT) -> tuple[str | None, uuid.UUID | None]:
    """Add the job's node to its execution's ``failed_nodes`` (once) and fail the execution.

    Returns ``(node_id, execution_id)``. Does nothing to a job without a workflow, nothing to a
    job that is already terminal, and nothing to an execution that was cancelled or completed
    meanwhile; never changes the job.
    """
    return _time_out_node(rt, job_id, waited)[1:]


def _time_out_node(rt: Runtime, job_id: uuid.UUID, waited: timedelta
                   ) -> tuple[str | None, str | None, uuid.UUID | None]:
    """``mark_node_timed_out``, decided under the job's row lock: ``(terminal status or None,
    node_id, execution_id)``. A job that finished after the waiter's last read is not timed out.
    A completion racing this write waits on the job row until it commits, then sees the failed
    execution and reopens it (sole cause) — the lock order, job then execution, is finalize's."""
    with rt.sessions.begin() as session:
        # --- issue 11 hole 8: the timeout is decided on the locked row, not a stale read ---
        row = session.execute(select(Job.status, Job.node_id, Job.workflow_execution_id)
                              .where(Job.id == job_id).with_for_update()).one_or_none()
        if row is None:
            raise JobNotFound()
        status, node_id, execution_id = row
        if status in TERMINAL:
            return status, node_id, execution_id
        # --- issue 11 hole 8 (end) ---
        if execution_id is None or node_id is None:
            return None, node_id, execution_id
        execution = session.execute(
            select(WorkflowExecution).where(WorkflowExecution.id == execution_id)
            .with_for_update()).scalar_one_or_none()
        if execution is None or execution.status in _SETTLED_EXECUTION:
            log.info("node_timeout_execution_left job_id=%s execution_id=%s status=%s", job_id,
                     execution_id, execution.status if execution else None)
            return None, node_id, execution_id
        failed = _node_list(execution.failed_nodes)
        if node_id not in failed:
            failed.append(node_id)
        message = execution.error_message if execution.status == "failed" and \
            execution.error_message else f"node {node_id} timed out after {_minutes(waited)}"
        # CAS on the status just read (under the row lock): never overrides a user's cancel
        session.execute(update(WorkflowExecution)
                        .where(WorkflowExecution.id == execution_id,
                               WorkflowExecution.status == execution.status)
                        .values(status="failed", failed_nodes=failed, error_message=message))
    return None, node_id, execution_id


def _node_list(value: Any) -> list[str]:
    """``failed_nodes`` as a list (jsonb list, a JSON string, or NULL)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [value]
    if isinstance(value, list):
        return [str(v) for v in value]
    return []


def _minutes(waited: timedelta) -> str:
    return f"{int(waited.total_seconds() // 60)} minutes"


from .core.facade import names_moved as _names_moved  # noqa: E402

_names_moved(__name__)
