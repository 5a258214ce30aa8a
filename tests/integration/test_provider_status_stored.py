"""The provider's last reported status is stored on the job (``jobs.provider_status``, README,
The provider's last status), in the statements a poll already makes, on PostgreSQL and SQLite.

Chain mode: a read's raw status goes with the chain's next message and that turn's one
``UPDATE`` stores it (an in-flight poll stays one statement). Batch mode: the set-based write of
the rows still running stores it, and so does the claim check before every other outcome. A
failed read keeps the stored status; a hostile status (huge, NUL, a lone surrogate, a number)
is bounded, never a failed poll. A real worker carries it in the message header.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.errors import ProviderError
from reconcile.jobstore import PROVIDER_STATUS_MAX
from reconcile.lifecycle import batch as batch_poll, poll
from reconcile.providers import PollResult, PollStatus
from reconcile.testing.counting import Counting
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import World

KIND = "replicate-prediction"  # the simulator's "running" is Replicate's "processing"
RUNNING = ((0.0, "running"),)

# (a provider's status, what the row stores)
HOSTILE = [
    ("x" * 100_000, "x" * PROVIDER_STATUS_MAX),
    ("run\x00ning", "run\ufffdning"),
    ("\ud800paused", "\ufffdpaused"),
    (12, "12"),
    ("ok\n" * 40, ("ok\n" * 40)[:PROVIDER_STATUS_MAX]),
]


class Carried:
    """The chain's messages with what they carry, as a Celery worker would receive them."""

    def __init__(self) -> None:
        self.sent: list[tuple[uuid.UUID, int, int, str | None]] = []

    def __call__(self, job_id: uuid.UUID, generation: int, seq: int, countdown: float,
                 status: str | None = None) -> None:
        self.sent.append((job_id, generation, seq, status))

    def run_next(self, w: World) -> str:
        job_id, generation, seq, status = self.sent.pop(0)
        return lifecycle.poll_step(w.rt, job_id, generation, seq, status)


def _chain(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
           timeline: Any = RUNNING) -> tuple[World, Carried, uuid.UUID]:
    """An accepted job in chain mode, its first poll message queued (it carries nothing)."""
    w = World(db, simulator, tmp_path)
    carried = Carried()
    w.rt.enqueue_poll = carried
    job_id = w.submit(KIND)
    w.sim.script(str(job_id), Script(timeline=timeline))
    assert lifecycle.create_step(w.rt, job_id).action == "accepted"
    assert [m[3] for m in carried.sent] == [None]
    return w, carried, job_id


def _reads(monkeypatch: pytest.MonkeyPatch, answers: list[PollResult | ProviderError]) -> None:
    def read_status(rt: Any, job: Any, kind: Any) -> PollResult | ProviderError:
        return answers.pop(0)

    monkeypatch.setattr(poll, "read_status", read_status)  # the chain's read
    monkeypatch.setattr(lifecycle, "read_status", read_status)  # batch mode's


# ----------------------------------------------------------------------------- chain mode


def test_the_chains_next_turn_stores_the_status_its_read_saw(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    w, carried, job_id = _chain(pg_and_sqlite, simulator, tmp_path)
    assert carried.run_next(w) == "in_flight"
    assert w.job(job_id).provider_status is None  # the first turn had nothing to store
    assert carried.sent[-1][3] == "processing"  # the read's status goes with the next message
    assert carried.run_next(w) == "in_flight"
    assert w.job(job_id).provider_status == "processing"


def test_a_status_the_adapter_does_not_know_is_stored_as_read(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """A token the adapter does not know is UNKNOWN (an observation, no verdict); its raw
    token is what the row keeps, for a rule to read."""
    w, carried, job_id = _chain(pg_and_sqlite, simulator, tmp_path, ((0.0, "unknown:on_hold"),))
    for _ in range(2):
        assert carried.run_next(w) == "in_flight"
    job = w.job(job_id)
    assert job.provider_status == "on_hold"
    assert job.reconcile_last_error_code == "UPSTREAM_UNKNOWN_STATUS"  # as before


def test_a_failed_read_keeps_the_stored_status(pg_and_sqlite: sessionmaker[Session],
                                               simulator: Simulator, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    w, carried, job_id = _chain(pg_and_sqlite, simulator, tmp_path)
    _reads(monkeypatch, [PollResult(PollStatus.RUNNING, raw_status="starting"),
                         ProviderError("read timed out"),
                         PollResult(PollStatus.RUNNING),  # an adapter that gives no raw status
                         PollResult(PollStatus.RUNNING, raw_status="processing"),
                         PollResult(PollStatus.RUNNING, raw_status="processing")])
    seen = []
    for _ in range(5):
        assert carried.run_next(w) == "in_flight"
        seen.append(w.job(job_id).provider_status)
    assert seen == [None, "starting", "starting", "starting", "processing"]


@pytest.mark.parametrize(("raw", "stored"), HOSTILE, ids=["huge", "nul", "surrogate", "number",
                                                          "newlines"])
def test_a_hostile_status_is_bounded_in_the_chain_never_fatal(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, raw: Any, stored: str) -> None:
    w, carried, job_id = _chain(pg_and_sqlite, simulator, tmp_path)
    _reads(monkeypatch, [PollResult(PollStatus.RUNNING, raw_status=raw)] * 2)
    assert carried.run_next(w) == "in_flight"
    assert carried.sent[-1][3] == stored  # bounded before it is carried
    assert carried.run_next(w) == "in_flight"
    job = w.job(job_id)
    assert (job.provider_status, job.status, job.reconcile_last_error) == (
        stored, "processing", None)


def test_a_turn_that_stores_a_status_is_still_one_statement(
        db: sessionmaker[Session], pg_engine: Engine, simulator: Simulator,
        tmp_path: Path) -> None:
    """The in-flight poll that learns nothing new: one transaction of one statement (the
    turn, which loads the row and now stores the status its message carried)."""
    w, carried, job_id = _chain(db, simulator, tmp_path)
    assert carried.run_next(w) == "in_flight"  # reads "processing": the next message carries it
    with Counting(pg_engine, sample_width=100_000) as counting:
        for name in ("stores", "unchanged"):
            with counting.step_named(name):
                assert carried.run_next(w) == "in_flight"
            assert (counting.of(name)["transactions"], counting.of(name)["statements"]) == (1, 1)
            assert counting.texts(name)[0].startswith("UPDATE jobs SET poll_seq")
    assert w.job(job_id).provider_status == "processing"


# ----------------------------------------------------------------------------- batch mode


def _batch(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
           timeline: Any = RUNNING, n: int = 1) -> tuple[World, list[uuid.UUID]]:
    w = World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=2)
    ids = [w.accept(KIND, Script(timeline=timeline)) for _ in range(n)]
    return w, ids


def _due(w: World) -> None:
    from datetime import timedelta

    w.clock.now += timedelta(seconds=3)  # Replicate's interval


def test_the_batch_write_of_running_rows_stores_their_status(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    w, ids = _batch(pg_and_sqlite, simulator, tmp_path, n=3)
    _due(w)
    report = batch_poll.poll_due(w.rt)
    assert report.running == 3 and report.observed == 0  # all in the one set-based write
    assert [w.job(j).provider_status for j in ids] == ["processing"] * 3


def test_every_other_batch_outcome_stores_its_status_with_the_claim_check(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """An unknown status goes through the chain's code per job; the claim check before it
    (``hold_claim``) stores the raw token."""
    w, (job_id,) = _batch(pg_and_sqlite, simulator, tmp_path, ((0.0, "unknown:on_hold"),))
    _due(w)
    report = batch_poll.poll_due(w.rt)
    assert report.observed == 1 and report.outcomes == {"in_flight": 1}
    assert w.job(job_id).provider_status == "on_hold"


def test_a_failed_batch_read_keeps_the_stored_status(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    w, (job_id,) = _batch(pg_and_sqlite, simulator, tmp_path)
    _reads(monkeypatch, [PollResult(PollStatus.RUNNING, raw_status="starting"),
                         ProviderError("read timed out"), PollResult(PollStatus.RUNNING)])
    seen = []
    for _ in range(3):
        _due(w)
        batch_poll.poll_due(w.rt)
        seen.append(w.job(job_id).provider_status)
    assert seen == ["starting", "starting", "starting"]


@pytest.mark.parametrize("path", ["running", "per_job"])
@pytest.mark.parametrize(("raw", "stored"), HOSTILE, ids=["huge", "nul", "surrogate", "number",
                                                          "newlines"])
def test_a_hostile_status_is_bounded_in_a_batch_never_fatal(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, raw: Any, stored: str, path: str) -> None:
    """Both batch writes: the set-based one (every row of the batch in one statement: one bad
    status must not fail the others) and the per-job claim check."""
    w, ids = _batch(pg_and_sqlite, simulator, tmp_path, n=2)
    status = PollStatus.RUNNING if path == "running" else PollStatus.UNKNOWN
    _reads(monkeypatch, [PollResult(status, raw_status=raw),
                         PollResult(PollStatus.RUNNING, raw_status="processing")])
    _due(w)
    report = batch_poll.poll_due(w.rt)
    assert sum(report.outcomes.values()) == 2 and set(report.outcomes) == {"in_flight"}
    assert sorted(w.job(j).provider_status or "" for j in ids) == sorted([stored, "processing"])
    assert all(w.job(j).status == "processing" for j in ids)


def test_a_chain_message_run_in_batch_mode_stores_both_statuses(
        pg_and_sqlite: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain message from before the switch to batch mode: its turn stores the status it
    carries, and the due time it leaves on the row (no further message) stores its read's."""
    chain, carried, job_id = _chain(pg_and_sqlite, simulator, tmp_path)
    job_id, generation, seq, _ = carried.sent.pop()
    w = World(pg_and_sqlite, simulator, tmp_path, poll_mode="batch", poll_batch_threads=1)
    w.clock.now = chain.clock.now
    w.rt.enqueue_poll = carried
    _reads(monkeypatch, [ProviderError("read timed out"),
                         PollResult(PollStatus.RUNNING, raw_status="processing")])
    assert lifecycle.poll_step(w.rt, job_id, generation, seq, "starting") == "in_flight"
    assert w.job(job_id).provider_status == "starting"  # the turn's; the read failed
    assert lifecycle.poll_step(w.rt, job_id, generation, seq + 1, "starting") == "in_flight"
    job = w.job(job_id)
    assert (job.provider_status, job.poll_due_at is not None) == ("processing", True)
    assert carried.sent == []  # batch mode: the row is due, no message


# ----------------------------------------------------------------------------- a real worker


@pytest.mark.slow
def test_a_real_workers_chain_carries_the_status_in_its_message_header(
        db: sessionmaker[Session], pg_url: str, redis_url: str, simulator: Simulator,
        tmp_path: Path) -> None:
    """``celery worker`` on Redis: the worker's own poll messages carry the status of their read
    in the ``reconcile_provider_status`` header (the three arguments unchanged), and the next
    turn stores it."""
    import redis

    from reconcile.celery_install import QUEUES
    from reconcile.db.models import Job
    from tests.integration.harness import fund, make_runtime
    from tests.integration.workers import Worker, make_sender, wait_for

    redis.Redis.from_url(redis_url).delete(*QUEUES)
    sender = make_sender(redis_url)
    rt, _ = make_runtime(db, simulator, tmp_path, time_scale=0.05)
    rt.enqueue_create = lambda jid, countdown=0.0: sender.send_task(
        "reconcile.create", args=[str(jid)], countdown=countdown or None)
    env = {**simulator.env(), "RECONCILE_DATABASE_URL": pg_url, "RECONCILE_BROKER_URL": redis_url,
           "RECONCILE_STORAGE_URL": f"file://{tmp_path / 'media'}",
           "RECONCILE_TIME_SCALE": "0.05",  # kie-standard: a read every 0.25 s
           "RECONCILE_WEBHOOK_BASE_URL": "https://platform.example/hooks",
           "RECONCILE_POLL_MODE": "chain"}  # the chain's message header
    worker = Worker(env, tmp_path / "worker.log")
    try:
        worker.wait_ready(timeout=60)
        user, job_id = uuid.uuid4(), uuid.uuid4()
        fund(db, user)
        simulator.script(str(job_id), Script(timeline=((0.0, "running"),)))
        lifecycle.submit_job(rt, user, "kie-standard", "m", {"prompt": "x"}, 30,
                             job_type="image", job_id=job_id)

        def stored() -> str | None:
            with db() as s:
                job = s.get(Job, job_id)
                return job.provider_status if job is not None else None

        assert wait_for(lambda: stored() == "generating", 60), \
            worker.log_path.read_text()[-3000:]  # KIE's market API says "generating"
        with db() as s:
            job = s.get(Job, job_id)
            assert job is not None and job.status == "processing" and job.poll_seq >= 2
    finally:
        worker.stop()
        redis.Redis.from_url(redis_url).delete(*QUEUES)

