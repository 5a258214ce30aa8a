"""The orchestrator's wait helper (README, Design notes: Orchestrators) on an injected clock.

The fake ``sleep`` moves the clock instead of waiting, and the upstream "finishes" the job
(through ``finalize_job_with_media``, the same path a poll or the sweep takes) once the clock
reaches the job's duration — so a 91-minute job takes a second of real time.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import NodeTimeout, Runtime, lifecycle, wait_for_job
from reconcile.db.models import Job, WorkflowExecution
from reconcile.errors import JobNotFound
from reconcile.orchestrator import mark_node_timed_out
from reconcile.providers import Output, PollResult, PollStatus
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import Clock, fund, make_runtime

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
USER = uuid.uuid4()  # the tables are truncated and the user funded again for every test
PNG = PollResult(PollStatus.SUCCEEDED, outputs=(Output(data=b"\x89PNG", media_type="image/png"),))


@pytest.fixture
def env(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> tuple[Runtime, Clock]:
    clock = Clock(T0)
    rt, _ = make_runtime(db, simulator, tmp_path, clock=clock)
    simulator.script_default(Script(timeline=((0.0, "queued"), (86400.0, "succeeded"))))
    fund(db, USER)
    return rt, clock


def new_execution(db: sessionmaker[Session], status: str = "running",
                  failed_nodes: list[str] | None = None) -> uuid.UUID:
    execution_id = uuid.uuid4()
    with db.begin() as s:
        s.add(WorkflowExecution(id=execution_id, status=status, failed_nodes=failed_nodes))
    return execution_id


def running_job(rt: Runtime, execution_id: uuid.UUID, node_id: str) -> uuid.UUID:
    """A KIE job of workflow node ``node_id``, accepted upstream and in flight."""
    job_id = lifecycle.submit_job(rt, USER, "kie-lip-sync", "kling/lip-sync", {"prompt": "talk"},
                                  40, job_type="video", workflow_execution_id=execution_id,
                                  node_id=node_id, enqueue=False).job_id
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    return job_id


def complete(rt: Runtime, job_id: uuid.UUID) -> bool:
    return lifecycle.finalize_job_with_media(rt, job_id, PNG, source="poll")


class Upstream:
    """The fake ``sleep``: advances the clock and finishes the job at ``finish_after``."""

    def __init__(self, rt: Runtime, clock: Clock, job_id: uuid.UUID,
                 finish_after: timedelta | None) -> None:
        self.rt, self.clock, self.job_id, self.finish_after = rt, clock, job_id, finish_after
        self.start = clock.now
        self.sleeps: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.clock.advance(seconds=seconds)
        if self.finish_after is not None and self.clock.now - self.start >= self.finish_after:
            self.finish_after = None
            assert complete(self.rt, self.job_id)


def execution(db: sessionmaker[Session], execution_id: uuid.UUID) -> tuple[str, object, str | None]:
    with db() as s:
        row = s.get(WorkflowExecution, execution_id)
        assert row is not None
        return row.status, row.failed_nodes, row.error_message


def job_status(db: sessionmaker[Session], job_id: uuid.UUID) -> str:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job.status


@pytest.mark.parametrize("minutes", [30, 60, 89])
def test_jobs_up_to_89_minutes_finish_within_the_node_timeout(env, db, minutes: int) -> None:
    """30-, 60- and 89-minute jobs complete while the node still waits (every 3 s)."""
    rt, clock = env
    execution_id = new_execution(db)
    job_id = running_job(rt, execution_id, "X")
    upstream = Upstream(rt, clock, job_id, timedelta(minutes=minutes))
    assert wait_for_job(rt, job_id, sleep=upstream) == "completed"
    assert set(upstream.sleeps) == {3.0}
    assert len(upstream.sleeps) == minutes * 60 // 3
    assert execution(db, execution_id) == ("running", None, None)


def test_at_91_minutes_the_node_fails_but_the_job_stays_in_flight(env, db) -> None:
    """The node times out at 90 minutes: failed_nodes gains it, the execution fails, the job is
    left in flight; its completion at 91 minutes reopens the execution (sole cause)."""
    rt, clock = env
    execution_id = new_execution(db)
    job_id = running_job(rt, execution_id, "X")
    upstream = Upstream(rt, clock, job_id, None)
    with pytest.raises(NodeTimeout) as caught:
        wait_for_job(rt, job_id, sleep=upstream, clock=clock)
    assert clock.now - upstream.start == timedelta(minutes=90)
    assert (caught.value.job_id, caught.value.node_id, caught.value.execution_id) == \
        (job_id, "X", execution_id)
    assert job_status(db, job_id) == "processing"
    status, failed_nodes, message = execution(db, execution_id)
    assert (status, failed_nodes) == ("failed", ["X"]) and message and "X" in message

    mark_node_timed_out(rt, job_id)  # a second timeout report adds no duplicate
    assert execution(db, execution_id)[:2] == ("failed", ["X"])

    clock.advance(minutes=1)
    assert complete(rt, job_id)
    assert job_status(db, job_id) == "completed"
    assert execution(db, execution_id) == ("completed", [], None)


def test_a_multi_failure_execution_stays_failed(env, db) -> None:
    """Two nodes timed out (failed_nodes [X, Y]): completing X does not reopen the execution."""
    rt, clock = env
    execution_id = new_execution(db)
    job_x = running_job(rt, execution_id, "X")
    job_y = running_job(rt, execution_id, "Y")
    for job_id in (job_x, job_y):
        with pytest.raises(NodeTimeout):
            wait_for_job(rt, job_id, interval=60.0, sleep=Upstream(rt, clock, job_id, None))
    status, failed_nodes, first_message = execution(db, execution_id)
    assert (status, failed_nodes) == ("failed", ["X", "Y"])
    assert first_message and "X" in first_message  # the first cause's message is kept

    assert complete(rt, job_x)
    assert job_status(db, job_x) == "completed"
    assert execution(db, execution_id) == ("failed", ["X", "Y"], first_message)


def test_a_user_cancelled_execution_is_not_reopened(env, db) -> None:
    """Timeout, then the user cancels the workflow: a late completion leaves it cancelled."""
    rt, clock = env
    execution_id = new_execution(db)
    job_id = running_job(rt, execution_id, "X")
    with pytest.raises(NodeTimeout):
        wait_for_job(rt, job_id, interval=60.0, sleep=Upstream(rt, clock, job_id, None))
    with db.begin() as s:
        s.execute(update(WorkflowExecution).where(WorkflowExecution.id == execution_id)
                  .values(status="cancelled"))
    assert complete(rt, job_id)
    assert execution(db, execution_id)[:2] == ("cancelled", ["X"])


def test_a_timeout_never_overrides_a_user_cancel(env, db) -> None:
    """The execution was cancelled while the node waited: the timeout leaves it cancelled."""
    rt, clock = env
    execution_id = new_execution(db, status="cancelled")
    job_id = running_job(rt, execution_id, "X")
    with pytest.raises(NodeTimeout):
        wait_for_job(rt, job_id, interval=60.0, sleep=Upstream(rt, clock, job_id, None))
    assert execution(db, execution_id) == ("cancelled", None, None)
    assert job_status(db, job_id) == "processing"


def test_a_failed_job_is_returned_as_failed(env, db) -> None:
    """The wait returns whatever terminal status the job reaches; the execution is untouched."""
    rt, clock = env
    execution_id = new_execution(db)
    job_id = running_job(rt, execution_id, "X")

    def fail_soon(seconds: float) -> None:
        clock.advance(seconds=seconds)
        lifecycle.fail_job(rt, job_id, "UPSTREAM_FAILED", "boom", None)

    assert wait_for_job(rt, job_id, sleep=fail_soon) == "failed"
    assert execution(db, execution_id) == ("running", None, None)


def test_a_job_without_a_workflow_times_out_without_writes(env, db) -> None:
    """No execution to mark: the timeout is still raised and the job left alone."""
    rt, clock = env
    job_id = lifecycle.submit_job(rt, USER, "kie-standard", "m/x", {"prompt": "a"}, 5,
                                  job_type="image", enqueue=False).job_id
    with pytest.raises(NodeTimeout) as caught:
        wait_for_job(rt, job_id, node_timeout=timedelta(minutes=1),
                     sleep=Upstream(rt, clock, job_id, None))
    assert (caught.value.node_id, caught.value.execution_id) == (None, None)
    assert job_status(db, job_id) == "pending"


def test_an_unknown_job_is_not_found(env) -> None:
    rt, _ = env
    with pytest.raises(JobNotFound):
        wait_for_job(rt, uuid.uuid4(), sleep=lambda s: None)


class CompletesAtTheDeadline:
    """The waiter's clock: the first time it is read at the node timeout (right after the
    waiter read the job as in flight, before it fails the node) the job completes."""

    def __init__(self, rt: Runtime, clock: Clock, job_id: uuid.UUID) -> None:
        self.rt, self.clock, self.job_id, self.start = rt, clock, job_id, clock.now
        self.completed = False

    def __call__(self) -> datetime:
        if not self.completed and self.clock.now - self.start >= timedelta(minutes=90):
            self.completed = True
            assert complete(self.rt, self.job_id)
        return self.clock.now


def test_a_job_completing_between_the_read_and_the_node_timeout_is_not_timed_out(env, db) -> None:
    """Issue 11 hole 8: the job completes after wait_for_job read it in flight and before the
    node fails. The timeout is decided on the locked row: the wait returns ``completed`` and
    the execution is not left ``failed ['X']`` with its job completed."""
    rt, clock = env
    execution_id = new_execution(db)
    job_id = running_job(rt, execution_id, "X")
    racing = CompletesAtTheDeadline(rt, clock, job_id)
    assert wait_for_job(rt, job_id, interval=60.0, clock=racing,
                        sleep=Upstream(rt, clock, job_id, None)) == "completed"
    assert racing.completed and job_status(db, job_id) == "completed"
    assert execution(db, execution_id) == ("running", None, None)


def test_a_completion_racing_the_node_timeout_write_reopens_the_execution(env, db, pg_engine) -> None:
    """The completion starts while the node-timeout transaction holds the job row: it waits,
    then sees the failed execution (sole cause) and reopens it; nothing is left failed."""
    import threading

    from sqlalchemy import event, text

    rt, clock = env
    execution_id = new_execution(db)
    job_id = running_job(rt, execution_id, "X")
    finisher: list[threading.Thread] = []

    def after_execute(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if finisher or not statement.lstrip().upper().startswith("UPDATE WORKFLOW_EXECUTIONS"):
            return
        thread = threading.Thread(target=complete, args=(rt, job_id))
        finisher.append(thread)
        thread.start()
        with pg_engine.connect() as probe:  # wait until the completion is blocked on a lock
            for _ in range(600):
                waiting = probe.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()")).scalar_one()
                if waiting:
                    break
                probe.rollback()
                threading.Event().wait(0.05)

    event.listen(pg_engine, "after_cursor_execute", after_execute)
    try:
        with pytest.raises(NodeTimeout):
            wait_for_job(rt, job_id, interval=60.0, clock=clock,
                         sleep=Upstream(rt, clock, job_id, None))
    finally:
        event.remove(pg_engine, "after_cursor_execute", after_execute)
    assert finisher
    finisher[0].join(timeout=60)
    assert job_status(db, job_id) == "completed"
    assert execution(db, execution_id) == ("completed", [], None)
