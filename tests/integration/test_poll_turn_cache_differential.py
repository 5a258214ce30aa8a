"""Attack on the cached poll turn (turns._turn_by_kind lru_cache, poll._turn_leases cache).

Differential: the pre-change turn (3ea0366 jobstore.take_poll_turn/_lease_by_kind and
lifecycle._turn_leases, ported verbatim below) and the current one run on twin rows; the
written ``poll_lease_expires_at`` and ``poll_seq`` must be equal, and equal to the kind's
``interval_at(age)`` lease. PostgreSQL and SQLite.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import and_, case, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Kind, jobstore, register_kind
from reconcile.db.models import Job
from reconcile.kinds import all_kinds, unregister_kind
from reconcile.lifecycle import poll as lpoll
from reconcile.states import IN_FLIGHT, POLL_LEASE_SLACK

NOW = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)
US = timedelta(microseconds=1)
S2, S10 = timedelta(minutes=2), timedelta(minutes=10)


class _Settings:
    def __init__(self, time_scale: float) -> None:
        self.time_scale = time_scale

    def scaled(self, duration: timedelta) -> timedelta:
        return duration * self.time_scale


class _Rt:
    def __init__(self, time_scale: float) -> None:
        self.settings = _Settings(time_scale)


# ---------------------------------------------------------------- 3ea0366, verbatim semantics
def _old_leases(rt: _Rt, now: datetime) -> dict[str, list[tuple[timedelta | None, datetime]]]:
    return {kind.name: [(after, now + rt.settings.scaled(interval * 2 + POLL_LEASE_SLACK))
                        for after, interval in kind.interval_steps()] for kind in all_kinds()}


def _old_lease_by_kind(steps: Mapping[str, Any], now: datetime) -> Any:
    groups: dict[Any, list[str]] = {}
    for name, kind_steps in steps.items():
        groups.setdefault(tuple(kind_steps), []).append(name)
    started = func.coalesce(Job.provider_call_started_at, now)
    whens: list[Any] = []
    for kind_steps, names in groups.items():
        of_kind = Job.provider_kind.in_(names)
        for age, until in kind_steps:
            whens.append((of_kind if age is None else and_(of_kind, started <= now - age), until))
    if not whens:
        return Job.poll_lease_expires_at
    return case(*whens, else_=Job.poll_lease_expires_at)


def _old_turn(session: Session, job_id: uuid.UUID, generation: int, seq: int, rt: _Rt,
              now: datetime) -> Job | None:
    steps = _old_leases(rt, now)
    stmt = update(Job).where(
        Job.id == job_id, Job.status.in_(IN_FLIGHT), Job.provider_task_id.is_not(None),
        Job.poll_generation == generation, Job.poll_seq == seq,
        Job.provider_kind.in_(list(steps)),
    ).values(poll_seq=seq + 1, poll_lease_expires_at=_old_lease_by_kind(steps, now)).returning(Job)
    return session.execute(stmt, execution_options={"synchronize_session": False,
                                                    "populate_existing": True}).scalar_one_or_none()


def _new_turn(session: Session, job_id: uuid.UUID, generation: int, seq: int, rt: _Rt,
              now: datetime) -> Job | None:
    return jobstore.take_poll_turn(session, job_id, generation, seq,
                                   lpoll._turn_leases(rt), now=now)  # type: ignore[arg-type]


# ---------------------------------------------------------------- fixtures
MULTI = Kind(name="atkmulti-a", sync=False, stale_threshold=timedelta(hours=1),
             poll_interval=timedelta(seconds=3), result_url_lifetime=None, plant=None,
             client="x:y", backoff=((S2, timedelta(seconds=15)), (S10, timedelta(seconds=60))))
TWIN = Kind(name="atkmulti-b", sync=False, stale_threshold=timedelta(hours=1),
            poll_interval=timedelta(seconds=3), result_url_lifetime=None, plant=None,
            client="x:y", backoff=((S2, timedelta(seconds=15)), (S10, timedelta(seconds=60))))
PLAIN = Kind(name="atkplain", sync=False, stale_threshold=timedelta(hours=1),
             poll_interval=None, result_url_lifetime=None, plant=None, client="x:y")


@pytest.fixture(params=["postgresql", "sqlite"])
def factory(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[sessionmaker[Session]]:
    for kind in (MULTI, TWIN, PLAIN):
        register_kind(kind, replace=True)
    try:
        if request.param == "postgresql":
            yield request.getfixturevalue("db")
        else:
            from reconcile.db.migrate import upgrade
            from reconcile.db.session import make_engine, make_sessionmaker

            url = f"sqlite:///{tmp_path / 'turn.db'}"
            upgrade(url)
            engine = make_engine(url)
            yield make_sessionmaker(engine)
            engine.dispose()
    finally:
        for name in ("atkmulti-a", "atkmulti-b", "atkplain", "atklate", "atkunknown"):
            unregister_kind(name)


def _row(db: sessionmaker[Session], kind: str, started: datetime | None, *,
         status: str = "processing", task: str | None = "t-1", generation: int = 1,
         seq: int = 0) -> uuid.UUID:
    job_id = uuid.uuid4()
    with db.begin() as s:
        s.add(Job(id=job_id, user_id=uuid.uuid4(), job_type="image", status=status,
                  provider_kind=kind, provider_task_id=task, provider_call_started_at=started,
                  poll_generation=generation, poll_seq=seq,
                  poll_lease_expires_at=NOW - timedelta(hours=5)))
    return job_id


def _state(db: sessionmaker[Session], job_id: uuid.UUID) -> tuple[Any, ...]:
    with db() as s:
        job = s.execute(select(Job).where(Job.id == job_id)).scalar_one()
        return job.poll_seq, job.poll_lease_expires_at, job.status, job.poll_generation


def _both(db: sessionmaker[Session], kind: str, started: datetime | None, rt: _Rt,
          now: datetime = NOW, **row: Any) -> tuple[Any, Any]:
    gen, seq = row.pop("call_generation", row.get("generation", 1)), row.pop("call_seq", row.get("seq", 0))
    a, b = _row(db, kind, started, **row), _row(db, kind, started, **row)
    with db.begin() as s:
        old = _old_turn(s, a, gen, seq, rt, now)
    with db.begin() as s:
        new = _new_turn(s, b, gen, seq, rt, now)
    assert (old is None) == (new is None)
    return _state(db, a), _state(db, b)


AGES: list[timedelta | None] = [None, timedelta(0), S2 - US, S2, S2 + US, S10 - US, S10, S10 + US,
                                timedelta(days=3), -timedelta(minutes=1)]


@pytest.mark.parametrize("kind", [MULTI, TWIN, PLAIN], ids=lambda k: k.name)
def test_lease_equals_old_code_either_side_of_every_step_and_scale(
        factory: sessionmaker[Session], kind: Kind) -> None:
    rts = [_Rt(1.0), _Rt(0.01), _Rt(1.0), _Rt(2.5)]  # interleaved scales in one process
    for rt in rts:
        for age in AGES:
            started = None if age is None else NOW - age
            old, new = _both(factory, kind.name, started, rt)
            assert old == new, (kind.name, age, rt.settings.time_scale)
            expected = NOW + rt.settings.scaled(
                kind.interval_at(timedelta(0) if age is None else age) * 2 + POLL_LEASE_SLACK)
            assert new[0] == 1 and new[1] == expected, (kind.name, age, rt.settings.time_scale)


def test_kind_registered_or_replaced_after_first_poll(factory: sessionmaker[Session]) -> None:
    rt = _Rt(1.0)
    _both(factory, MULTI.name, NOW, rt)  # warm both caches
    late = Kind(name="atklate", sync=False, stale_threshold=timedelta(hours=1),
                poll_interval=timedelta(seconds=7), result_url_lifetime=None, plant=None,
                client="x:y", backoff=((timedelta(minutes=1), timedelta(seconds=40)),))
    register_kind(late)
    for age in (timedelta(seconds=59), timedelta(minutes=1)):
        old, new = _both(factory, "atklate", NOW - age, rt)
        assert old == new and new[0] == 1
        assert new[1] == NOW + late.interval_at(age) * 2 + POLL_LEASE_SLACK
    # replaced with other steps: the new steps apply at once
    register_kind(Kind(name="atklate", sync=False, stale_threshold=timedelta(hours=1),
                       poll_interval=timedelta(seconds=1), result_url_lifetime=None, plant=None,
                       client="x:y"), replace=True)
    old, new = _both(factory, "atklate", NOW - timedelta(minutes=5), rt)
    assert old == new and new[1] == NOW + timedelta(seconds=2) + POLL_LEASE_SLACK
    # unregistered after polls: its rows lose the turn, untouched
    unregister_kind("atklate")
    old, new = _both(factory, "atklate", NOW, rt)
    assert old == new and new[0] == 0 and new[1] == NOW - timedelta(hours=5)


def test_unknown_kind_and_fence_refuse_stale_turns(factory: sessionmaker[Session]) -> None:
    rt = _Rt(1.0)
    untouched = (0, NOW - timedelta(hours=5))
    for kind, row in [("atkunknown", {}),
                      (MULTI.name, {"call_seq": 1}),               # stale seq
                      (MULTI.name, {"call_generation": 0}),        # stale generation
                      (MULTI.name, {"call_generation": 2}),        # future generation
                      (MULTI.name, {"status": "completed"}),
                      (MULTI.name, {"status": "failed"}),
                      (MULTI.name, {"task": None}),
                      (None, {})]:
        old, new = _both(factory, kind, NOW - S10, rt, **row)  # type: ignore[arg-type]
        assert old == new and new[:2] == untouched, (kind, row)
    # a duplicate run of the same turn loses the second time
    job = _row(factory, MULTI.name, NOW)
    with factory.begin() as s:
        assert _new_turn(s, job, 1, 0, rt, NOW) is not None
    with factory.begin() as s:
        assert _new_turn(s, job, 1, 0, rt, NOW + timedelta(seconds=1)) is None
    assert _state(factory, job)[:2] == (1, NOW + timedelta(seconds=6) + POLL_LEASE_SLACK)
