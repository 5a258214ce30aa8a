"""Hostile review of the batch-by-default change.

Every path that (re)starts polling, driven under ``poll_mode="batch"``, must leave the row due
or claimable, and each job must finish exactly once with one ledger settlement. Tests named
The ticker's back-off test reproduces what the review found (a message a second per process
while nobody takes them); the others pin behaviour that held under attack.
"""

from __future__ import annotations

import random
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, lifecycle
from reconcile.db.models import CreditTransaction
from reconcile.lifecycle import batch as batch_poll
from reconcile.states import IN_FLIGHT
from reconcile.sweep.liveness import reap
from reconcile.testing.simulator import Script, Simulator
from reconcile.worker import ticker as ticker_mod
from tests.integration._sweep_helpers import FOREVER, INSTANT, World

KIND = "replicate-prediction"
INTERVAL = timedelta(seconds=3)


def _twin(w: World, db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
          **settings: Any) -> World:
    other = World(db, simulator, tmp_path / f"twin-{uuid.uuid4().hex[:6]}", **settings)
    other.clock = w.clock
    other.rt.clock = w.clock
    other.user = w.user
    return other


def _count(w: World, model: Any, *where: Any) -> int:
    with w.db() as s:
        return s.execute(select(func.count()).select_from(model).where(*where)).scalar_one()


def _settled_once(w: World, job_id: uuid.UUID) -> None:
    job = w.job(job_id)
    refunds = _count(w, CreditTransaction, CreditTransaction.job_id == job_id,
                     CreditTransaction.type == "REFUND")
    if job.status == "completed":
        assert w.completions(job_id) == 1 and refunds == 0, (job_id, refunds)
        assert job.credits_actual is not None and job.credits_actual > 0
    else:
        assert job.status in ("failed", "cancelled"), job.status
        assert w.completions(job_id) == 0 and refunds == 1


# ----------------------------------------------------------------------------- paths under batch


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path, poll_mode="batch", poll_batch_threads=2)


def test_operator_resolve_upstream_id_under_batch_is_due_and_completes_once(world: World) -> None:
    """``reconcile resolve --upstream-id`` (operator.run → adopt_upstream_id) in batch mode."""
    from reconcile import operator
    from tests.integration._sweep_helpers import uncertain_kie

    w = world
    job_id = uncertain_kie(w)
    upstream = w.sim.tasks_for(str(job_id))[0].task_id
    w.clock.now += timedelta(minutes=30)  # the create claim long expired
    w.sim.set_state(upstream, "succeeded")
    done = operator.run(w.rt, operator.RESOLVE_UPSTREAM, job_id,
                        operator=operator.Operator("attack", "cli"), reason="seen upstream",
                        upstream_id=upstream)
    assert done.changed
    assert list(w.q.polls) == []
    job = w.job(job_id)
    assert job.poll_due_at is not None and job.poll_due_at <= w.clock.now
    batch_poll.poll_due(w.rt, budget=60)
    assert w.job(job_id).status == "completed"
    _settled_once(w, job_id)
    assert w.audit() == []


def test_reaper_of_a_chain_era_turn_under_batch_makes_the_row_due(
        world: World, db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """Rolling deploy: a chain-era row (no due time) whose turn a now-dead worker took while
    running in batch mode (the queued message from before the switch). The reaper must make the
    row due (the sweep's resume, batch flavour), and poll_due completes it once."""
    from tests.integration.test_worker_heartbeat import _workers

    chain = _twin(world, db, simulator, tmp_path, poll_mode="chain")
    job_id = chain.submit(KIND)
    simulator.script(str(job_id), Script(timeline=FOREVER))
    assert lifecycle.create_step(chain.rt, job_id).action == "accepted"
    (queued,) = list(chain.q.polls)
    assert world.job(job_id).poll_due_at is None
    # a batch-mode worker takes the chain message's turn and dies before reading
    with world.db.begin() as s:
        assert jobstore.take_poll_turn(s, job_id, int(queued[1]), int(queued[2]),
                                       world.clock.now + timedelta(minutes=5),
                                       worker="w-dead") is not None
    _workers(db, world.rt, **{"w-dead": True})
    report = reap(world.rt)
    assert report.workers == ["w-dead"]
    job = world.job(job_id)
    assert job.poll_due_at is not None, "reaped chain-era row left with no due time in batch mode"
    simulator.set_state(job.provider_task_id or "", "succeeded")
    batch_poll.poll_due(world.rt, budget=60)
    assert world.job(job_id).status == "completed"
    _settled_once(world, job_id)


def test_cancel_between_claim_and_write_refunds_once_and_never_charges(world: World) -> None:
    from reconcile.lifecycle.cancel import cancel_job

    w = world
    job_id = w.accept(KIND, Script(timeline=INSTANT))
    w.clock.now += INTERVAL
    claims = batch_poll.claim(w.rt)
    assert [c.job.id for c in claims] == [job_id]
    cancel_job(w.rt, w.user, job_id)
    batch_poll.run_claims(w.rt, claims)
    w.clock.now += timedelta(hours=1)
    batch_poll.poll_due(w.rt, budget=60)
    w.tick()
    assert w.job(job_id).status == "cancelled"
    _settled_once(w, job_id)
    assert w.audit() == []


# ----------------------------------------------------------------------------- mixed fleet


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_mixed_fleet_chain_and_batch_runtimes_never_double_finish_or_strand(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, seed: int) -> None:
    """A rolling deploy: one runtime in chain mode (old release / env pinned), one in batch mode
    (new default), on the same rows and the same queue of chain messages. Random interleaving
    of: each runtime's sweep tick, the batch poller, a chain message run on either runtime (the
    shared reconcile.poll queue), creates on either runtime, clock steps. Every job must finish
    once with one settlement and none may be left with no way forward."""
    rng = random.Random(seed)
    batch = World(db, simulator, tmp_path / "b", poll_mode="batch", poll_batch_threads=1)
    chain = _twin(batch, db, simulator, tmp_path, poll_mode="chain")
    msgs: list[tuple[uuid.UUID, int, int]] = []

    def collect() -> None:
        for w in (batch, chain):
            while w.q.polls:
                msgs.append(tuple(w.q.polls.popleft()))  # type: ignore[arg-type]
            while w.q.creates:
                jid = w.q.creates.popleft()
                lifecycle.create_step(rng.choice((batch, chain)).rt, jid)
                collect()

    ids = []
    for _ in range(8):
        w = rng.choice((batch, chain))
        jid = w.submit(KIND)
        simulator.script(str(jid), Script(timeline=FOREVER))
        assert lifecycle.create_step(w.rt, jid).action == "accepted"
        ids.append(jid)
    collect()
    for step in range(900):
        if step == 300:  # the provider finishes every task (the simulator runs on its own clock)
            for j in ids:
                simulator.set_state(batch.job(j).provider_task_id or "", "succeeded")
        op = rng.random()
        if op < 0.25 and msgs:
            jid, gen, seq = msgs.pop(rng.randrange(len(msgs)))
            lifecycle.poll_step(rng.choice((batch, chain)).rt, jid, gen, seq)
        elif op < 0.45:
            batch_poll.poll_due(batch.rt, budget=60)
        elif op < 0.55:
            batch.tick()
        elif op < 0.65:
            chain.tick()
        else:
            batch.clock.now += timedelta(seconds=rng.choice((1, 2, 3, 5, 10, 30)))
        collect()
        if step > 300 and all(batch.job(j).status not in IN_FLIGHT for j in ids):
            break
    stuck = [(j, batch.job(j).status, batch.job(j).poll_due_at) for j in ids
             if batch.job(j).status in IN_FLIGHT]
    assert stuck == [], stuck
    for j in ids:
        _settled_once(batch, j)
    assert batch.audit() == []


# ----------------------------------------------------------------------------- the ticker


class _FakeRt:
    def __init__(self, mode: str, every: float = 1.0) -> None:
        from reconcile.settings import Settings

        self.settings = Settings(poll_mode=mode, poll_batch_interval=every)


def test_ticker_ends_in_chain_mode_and_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Any] = []
    t = ticker_mod.Ticker(lambda: _FakeRt("chain"), lambda: True,
                          lambda *a, **k: sent.append((a, k)))
    assert t.tick() is None and sent == []


@pytest.mark.parametrize("serves", [True, False])
def test_an_hour_of_nudges_nobody_takes_is_about_one_a_minute(
        monkeypatch: pytest.MonkeyPatch, serves: bool) -> None:
    """Found here: the ticker re-armed after ``expires`` whether or not its previous nudge was
    taken, and on Redis an expired message stays queued until a worker receives it, so with
    the pollers down every worker process (create-only ones too) appended one message a second
    to the poll queue (live: ``LLEN reconcile.poll`` 11 -> 31 -> 51 -> 71 at 10-s intervals
    from a ``-Q reconcile.create -c 2`` worker). Now a process that does not consume the poll
    queue never nudges, and one whose nudges are not taken (the same row still waits) backs off
    to one a minute: one simulated hour of a row that nobody claims."""
    from datetime import UTC, datetime

    sent: list[Any] = []
    clock = [1000.0]
    waiting = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    monkeypatch.setattr(ticker_mod.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(batch_poll, "stalled", lambda rt, now=None: waiting)
    t = ticker_mod.Ticker(lambda: _FakeRt("batch"), lambda: True,
                          lambda *a, **k: sent.append((a, k)), serves)
    for _ in range(3600):
        t.tick()
        clock[0] += 1.0
    assert len(sent) == (65 if serves else 0), len(sent)
