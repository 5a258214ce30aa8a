"""Attack: the cached poll-turn statement shared by 16 threads racing for the same turns (PG),
with two time scales interleaved: exactly one winner per turn, and its lease is its scale's."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore, register_kind
from reconcile.db.models import Job
from reconcile.kinds import unregister_kind
from reconcile.lifecycle import poll as lpoll
from reconcile.states import POLL_LEASE_SLACK
from tests.integration.test_poll_turn_cache_differential import MULTI, NOW, _row, _Rt


def test_one_winner_per_turn_under_a_race(db: sessionmaker[Session]) -> None:
    register_kind(MULTI, replace=True)
    try:
        jobs = [_row(db, MULTI.name, NOW - timedelta(minutes=5)) for _ in range(20)]
        rts = [_Rt(1.0), _Rt(0.5)]
        start = threading.Barrier(16)
        wins: list[tuple[uuid.UUID, int, float]] = []
        errors: list[BaseException] = []

        def run(n: int) -> None:
            rt = rts[n % 2]
            start.wait()
            try:
                for seq in range(3):
                    for job_id in jobs:
                        with db.begin() as s:
                            turn = jobstore.take_poll_turn(s, job_id, 1, seq,
                                                           lpoll._turn_leases(rt), now=NOW)  # type: ignore[arg-type]
                            if turn is not None:
                                want = NOW + (timedelta(seconds=30) + POLL_LEASE_SLACK) * \
                                    rt.settings.time_scale
                                assert turn.poll_lease_expires_at == want
                                wins.append((job_id, seq, rt.settings.time_scale))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(n,)) for n in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        # a seq is won at most once; the turns a thread reaches late are lost, never doubled
        assert len({(j, s) for j, s, _ in wins}) == len(wins)
        with db() as s:
            seqs = dict(s.execute(select(Job.id, Job.poll_seq).where(Job.id.in_(jobs))).all())
        for job_id in jobs:
            won = sorted(s for j, s, _ in wins if j == job_id)
            assert won == list(range(seqs[job_id])), (won, seqs[job_id])
    finally:
        unregister_kind(MULTI.name)
