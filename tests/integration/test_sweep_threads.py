"""The sweep carries out a page's rows several at once, and fans out in chunks.

The Celery sweep task passes ``sweep_threads``: the claimed rows of one page are carried out
that many at once (each in its own transactions), and the rows past the time budget go out
``CHUNK_ROWS_PER_THREAD × sweep_threads`` per ``reconcile.reconcile_jobs`` message, which
carries them out ``sweep_threads`` at a time; a row that would start too late for its task's
time limit is sent again instead. A direct ``sweep(rt)`` stays one row after the other.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import tasks
from reconcile.db.models import Asset, CreditTransaction, Job
from reconcile.lifecycle import poll
from reconcile.sweep import reconcile_jobs, sweep, tick
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import INSTANT, World


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path)


_REAL_READ = poll.read_status


def _stale(w: World, n: int, *, failing: int = 0) -> tuple[list[uuid.UUID], list[uuid.UUID]]:
    done = [w.accept("kie-standard", Script(timeline=INSTANT)) for _ in range(n)]
    failed = [w.accept("kie-standard", Script(timeline=((0.0, "failed"),)))
              for _ in range(failing)]
    w.clock.advance(minutes=11)
    return done, failed


def _reads_meet(monkeypatch: pytest.MonkeyPatch, parties: int) -> list[str]:
    """Every status read waits until ``parties`` reads are in flight at once (a barrier that
    breaks after 10 s): it passes only when the rows really are read concurrently."""
    barrier = threading.Barrier(parties, timeout=10)
    met: list[str] = []
    real = _REAL_READ

    def read_status(rt: Any, job: Any, kind: Any) -> Any:
        try:
            barrier.wait()
            met.append("met")
        except threading.BrokenBarrierError:
            met.append("alone")
        return real(rt, job, kind)

    monkeypatch.setattr(poll, "read_status", read_status)
    return met


def _money(db: sessionmaker[Session]) -> tuple[Counter[str], Counter[tuple[Any, str]], Counter[Any]]:
    with db() as s:
        statuses = Counter(s.execute(select(Job.status)).scalars())
        txns = Counter((t.job_id, t.type) for t in s.execute(select(CreditTransaction)).scalars())
        assets = Counter(s.execute(select(Asset.job_id)).scalars())
    return statuses, txns, assets


def test_a_page_is_carried_out_several_rows_at_once(world: World,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    w = world
    done, failed = _stale(w, 8, failing=4)
    met = _reads_meet(monkeypatch, 4)
    report = sweep(w.rt, threads=4)
    assert (report.recovered, report.failed, report.errors) == (8, 4, 0)
    assert met.count("met") == 12, met  # every read had three others in flight with it
    statuses, txns, assets = _money(w.db)
    assert statuses == {"completed": 8, "failed": 4}
    for job_id in done:
        assert (txns[(job_id, "COMMIT")], txns[(job_id, "REFUND")], assets[job_id]) == (1, 0, 1)
    for job_id in failed:
        assert (txns[(job_id, "COMMIT")], txns[(job_id, "REFUND")], assets[job_id]) == (0, 1, 0)
    assert w.audit() == []


def test_a_direct_sweep_stays_one_row_after_the_other(world: World,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The default: no read ever has company (so the explorer's and the tests' direct sweeps
    keep their order)."""
    w = world
    _stale(w, 3)
    barrier = threading.Barrier(2, timeout=0.5)
    alone: list[bool] = []
    real = _REAL_READ

    def read_status(rt: Any, job: Any, kind: Any) -> Any:
        try:
            barrier.wait()
            alone.append(False)
        except threading.BrokenBarrierError:
            alone.append(True)
            barrier.reset()
        return real(rt, job, kind)

    monkeypatch.setattr(poll, "read_status", read_status)
    assert sweep(w.rt).recovered == 3
    assert alone == [True, True, True]


def test_past_the_budget_rows_go_out_in_chunks_and_each_chunk_runs_at_once(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Budget 0: nothing inline; 10 rows fan out as chunks of 4 (4, 4, 2) through the task's
    own fan-out; ``reconcile_jobs`` then carries each chunk out at once, every job finished
    exactly once."""
    w = world
    done, _ = _stale(w, 10)
    sent: list[list[uuid.UUID]] = []
    monkeypatch.setattr(tasks, "enqueue_reconcile_jobs", lambda ids: sent.append(list(ids)))
    chunks = tasks._Chunks(4)
    report = sweep(w.rt, budget=0, fan_out=chunks, threads=4)
    chunks.flush()
    assert report.fanned_out == 10 and report.recovered == 0
    assert [len(c) for c in sent] == [4, 4, 2]
    assert sorted(j for c in sent for j in c) == sorted(done)
    met = _reads_meet(monkeypatch, 4)
    outcomes = [reconcile_jobs(w.rt, chunk, threads=4) for chunk in sent[:2]]
    assert met.count("met") == 8, met
    met = _reads_meet(monkeypatch, 2)  # the last chunk: its two rows at once
    outcomes.append(reconcile_jobs(w.rt, sent[2], threads=4))
    assert met.count("met") == 2, met
    assert [o for chunk in outcomes for o in chunk] == ["completed"] * 10, outcomes
    # a chunk sent twice (a redelivery) finishes nothing twice
    assert "completed" not in reconcile_jobs(w.rt, sent[0], threads=4)
    statuses, txns, assets = _money(w.db)
    assert statuses == {"completed": 10}
    assert all(txns[(j, "COMMIT")] == 1 and assets[j] == 1 for j in done)
    assert w.audit() == []


def test_the_celery_task_flushes_its_last_chunk_even_when_the_tick_raises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[list[uuid.UUID]] = []
    monkeypatch.setattr(tasks, "enqueue_reconcile_jobs", lambda ids: sent.append(list(ids)))
    size = 2 * tasks.CHUNK_ROWS_PER_THREAD  # a chunk per message: sweep_threads (2) × rows each
    ids = [uuid.uuid4() for _ in range(size + 1)]

    class Boom(Exception):
        pass

    def run(rt: Any, *, fan_out: Any, threads: int) -> Any:
        for job_id in ids:
            fan_out(job_id)
        raise Boom

    import reconcile.sweep as sweep_module

    monkeypatch.setattr(sweep_module, "sweep", run)
    monkeypatch.setattr(tasks, "get_runtime", lambda: type("Rt", (), {
        "settings": type("S", (), {"sweep_threads": 2})()})())
    with pytest.raises(Boom):
        tasks.sweep.run()
    assert sent == [ids[:size], ids[size:]]


def test_a_chunk_starts_no_row_past_its_start_by_but_always_its_first_round(
        world: World) -> None:
    """A chunk of 6 rows, 2 threads: with the clock past ``start_by`` from the start, the first
    round (2 rows) still runs and the 4 others are deferred, untouched; with time left, all 6
    complete."""
    w = world
    done, _ = _stale(w, 6)
    outcomes = reconcile_jobs(w.rt, done, threads=2, start_by=0.0, clock=lambda: 1.0)
    assert outcomes == ["completed"] * 2 + [tick.DEFERRED] * 4, outcomes
    statuses = {job.id: job.status for job in _jobs(w.db, done)}
    assert [statuses[j] for j in done] == ["completed"] * 2 + ["processing"] * 4
    assert reconcile_jobs(w.rt, done[2:], threads=2, start_by=2.0,
                          clock=lambda: 1.0) == ["completed"] * 4
    assert w.audit() == []


def test_the_chunk_task_sends_its_deferred_rows_again(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Celery task: a row's bound longer than the soft time limit defers every row past the
    first round, and those go out again as one chunk (not claimed, nothing written)."""
    w = world
    done, _ = _stale(w, 5)
    # the library's Celery settings (a task soft time limit): whichever app this process has
    sent = _chunk_task(w, monkeypatch, threads=2, soft_limit=540)
    line = tasks.reconcile_jobs.run([str(j) for j in done])
    assert line.split(",") == ["completed"] * 2 + [tick.DEFERRED] * 3
    assert sent == [done[2:]]
    sent.clear()
    monkeypatch.setattr(tick, "row_bound", lambda rt: timedelta(seconds=0))
    assert tasks.reconcile_jobs.run([str(j) for j in done[2:]]).split(",") == ["completed"] * 3
    assert sent == []


def _jobs(db: sessionmaker[Session], ids: list[uuid.UUID]) -> list[Job]:
    with db() as s:
        return list(s.execute(select(Job).where(Job.id.in_(ids))).scalars())


def test_a_chunk_task_without_a_time_limit_defers_nothing(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """An app with no task time limit: nothing to outlast, every row of the chunk runs."""
    w = world
    done, _ = _stale(w, 3)
    sent = _chunk_task(w, monkeypatch, threads=1, soft_limit=None)
    monkeypatch.setitem(tasks.reconcile_jobs.app.conf, "task_time_limit", None)
    assert tasks.reconcile_jobs.run([str(j) for j in done]).split(",") == ["completed"] * 3
    assert sent == []


def _chunk_task(w: World, monkeypatch: pytest.MonkeyPatch, *, threads: int,
                soft_limit: int | None) -> list[list[uuid.UUID]]:
    """The chunk task on ``w``'s runtime with ``threads`` and a task soft time limit, a row's
    bound longer than any limit; returns the chunks it sends again (as they are sent)."""
    sent: list[list[uuid.UUID]] = []
    monkeypatch.setattr(tasks, "enqueue_reconcile_jobs", lambda ids: sent.append(list(ids)))
    monkeypatch.setattr(tasks, "get_runtime", lambda: w.rt)
    monkeypatch.setattr(w.rt.settings, "sweep_threads", threads)
    monkeypatch.setitem(tasks.reconcile_jobs.app.conf, "task_soft_time_limit", soft_limit)
    monkeypatch.setattr(tick, "row_bound", lambda rt: timedelta(days=1))
    return sent
