"""The prepared CAS statements (``jobstore.cas._cas_prepared`` and its kin): each converted
function, run on one row, and the old per-call statement (as it was before they were prepared,
copied here verbatim on top of the unchanged helpers), run on an identical twin row, must leave
the two rows equal column by column and return the same.

Backends: the test database (timestamptz, UTC), platform-shaped naive ``timestamp`` tables in
a non-UTC zone (database default / session option), and SQLite (the embedded default). ``now``
is an aware instant in a non-UTC offset as well as UTC."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import and_, case, func, or_, select, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import jobstore
from reconcile.db.migrate import upgrade
from reconcile.db.models import Job, JobEvent
from reconcile.db.session import make_engine, make_sessionmaker, rowcount
from reconcile.jobstore import batch, create
from reconcile.jobstore.cas import _cas, _run_with_event, _with_event
from reconcile.states import IN_FLIGHT, Status, Submission
from tests.conftest import PgDatabases
from tests.integration._platform_db import clean_sessions, platform_database

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
PLUS5 = timezone(timedelta(hours=5))


# --- the old per-call statements, verbatim ------------------------------------------------------

def old_claim_create(session: Session, job_id: uuid.UUID, token: str, now: datetime,
                     lease: timedelta, *, kinds: Any = None, worker: str | None = None) -> Any:
    where: list[Any] = [] if kinds is None else [Job.provider_kind.in_(list(kinds))]
    return _cas(
        session,
        Job.id == job_id,
        Job.status == Status.PENDING,
        Job.submission_state == Submission.NOT_STARTED,
        or_(Job.create_not_before.is_(None), Job.create_not_before <= now),
        *where,
        submission_state=Submission.SUBMITTING,
        claim_token=token,
        claim_expires_at=now + lease,
        provider_call_started_at=func.coalesce(Job.provider_call_started_at, now),
        started_at=now,
        claimed_by=worker,
    )


def old_save_task_id(session: Session, job_id: uuid.UUID, token: str, task_id: str,
                     now: datetime, poll_lease: timedelta, *, poll_due_at: datetime | None = None,
                     event: JobEvent | None = None) -> Any:
    where = create._owner(job_id, token)
    values = create._saved(task_id, now + poll_lease, poll_due_at)
    if event is None:
        return _cas(session, *where, **values)
    return old_cas_with_event(session, event, *where, **values)


def old_cas_with_event(session: Session, event: JobEvent, *where: Any, **values: Any) -> Any:
    if session.get_bind().dialect.name != "postgresql":
        row = _cas(session, *where, **values)
        if row is not None:
            event.job_id, event.user_id = row.id, row.user_id
            session.add(event)
        return row
    return _run_with_event(session, event, _with_event(where, values), {})


def old_claim_attempt(session: Session, job_id: uuid.UUID, now: datetime,
                      spacing: timedelta) -> Any:
    return _cas(
        session,
        Job.id == job_id,
        Job.status.in_(IN_FLIGHT),
        or_(Job.reconcile_last_attempt_at.is_(None),
            Job.reconcile_last_attempt_at <= now - spacing),
        reconcile_attempts=Job.reconcile_attempts + 1,
        reconcile_last_attempt_at=now,
    )


def old_make_due(session: Session, job_id: uuid.UUID, now: datetime, lease: timedelta) -> Any:
    return _cas(session, Job.id == job_id, Job.status.in_(IN_FLIGHT),
                Job.provider_task_id.is_not(None), Job.poll_due_at.is_(None),
                poll_generation=Job.poll_generation + 1, poll_seq=0, poll_due_at=now,
                poll_lease_expires_at=now + lease)


def old_hold_while_storing(session: Session, job_id: uuid.UUID, until: datetime, *,
                           claim: tuple[int, int] | None = None, now: datetime,
                           counted: bool = False) -> bool:
    at = batch._at(until)
    values: dict[str, Any] = {"storing_until": batch._later(Job.storing_until, at) if counted
                              else batch._new_mark(now, at)}
    if not counted:
        values["storing_count"] = batch._one_more(now)
    if claim is not None:
        mine = and_(*batch.under_claim(*claim))
        values["poll_lease_expires_at"] = case((mine, at), else_=Job.poll_lease_expires_at)
        values["poll_due_at"] = case((and_(mine, Job.poll_due_at.is_not(None)), at),
                                     else_=Job.poll_due_at)
    from sqlalchemy import update
    done = session.execute(
        update(Job).where(Job.id == job_id, Job.status.in_(IN_FLIGHT)).values(values),
        execution_options={"synchronize_session": False})
    return bool(rowcount(done))


# --- backends ----------------------------------------------------------------------------------

BACKENDS = ["pg", "pg-naive-NY-database", "pg-naive-Tokyo-session", "pg-tz-NY-session", "sqlite"]


@pytest.fixture(scope="module", params=BACKENDS)
def sessions(request: pytest.FixtureRequest, pg_databases: PgDatabases,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[sessionmaker[Session]]:
    name = request.param
    if name == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('prep')}/r.db"
        upgrade(url)
        engine = make_engine(url)
        yield make_sessionmaker(engine)
    elif name == "pg":
        url = pg_databases.create("prepdiff")
        upgrade(url)
        engine = make_engine(url)
        yield clean_sessions(engine)
    else:
        _, naive, zone, level = name.split("-")
        zone = {"NY": "America/New_York", "Tokyo": "Asia/Tokyo"}[zone]
        _, engine = platform_database(pg_databases, "prepplat", naive=naive == "naive",
                                      zone=zone, level=level)
        yield clean_sessions(engine)
    engine.dispose()


def _insert(sessions: sessionmaker[Session], **values: Any) -> uuid.UUID:
    job_id = uuid.uuid4()
    base = dict(id=job_id, user_id=uuid.UUID(int=7), job_type="image", status="pending",
                provider_kind="a", submission_state=Submission.NOT_STARTED,
                created_at=T0 - timedelta(days=1))
    base.update(values)
    with sessions.begin() as s:
        s.add(Job(**base))
    return job_id


def _row(sessions: sessionmaker[Session], job_id: uuid.UUID) -> dict[str, Any]:
    with sessions() as s:
        raw = dict(s.execute(text("SELECT * FROM jobs WHERE id = :id"),
                             {"id": job_id if s.get_bind().dialect.name == "postgresql"
                              else job_id.hex}).mappings().one())
    raw.pop("id")
    return raw


def _twin(sessions: sessionmaker[Session], old: Callable[..., Any], new: Callable[..., Any],
          setup: dict[str, Any], *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    a, b = _insert(sessions, **setup), _insert(sessions, **setup)
    LAST[:] = [a, b]
    with sessions.begin() as s:
        got_old = old(s, a, *args, **kwargs)
        if isinstance(got_old, Job):
            got_old = {c: getattr(got_old, c) for c in Job.__table__.c.keys() if c != "id"}
    with sessions.begin() as s:
        got_new = new(s, b, *args, **kwargs)
        if isinstance(got_new, Job):
            got_new = {c: getattr(got_new, c) for c in Job.__table__.c.keys() if c != "id"}
    row_a, row_b = _row(sessions, a), _row(sessions, b)
    assert row_a == row_b, {k: (row_a[k], row_b[k]) for k in row_a if row_a[k] != row_b[k]}
    assert got_old == got_new
    return row_a, got_new


def _running(job_id: uuid.UUID, now: datetime) -> JobEvent:
    """The ``running`` event a save writes (user 7, as the inserted rows have)."""
    return JobEvent(event_id=str(uuid.uuid4()), job_id=job_id, user_id=uuid.UUID(int=7),
                    type="running", payload={"k": 1}, created_at=now, published_at=None)


LAST: list[uuid.UUID] = []
NOWS = [T0, T0.astimezone(PLUS5)]


@pytest.mark.parametrize("now", NOWS, ids=["utc", "plus5"])
@pytest.mark.parametrize("kinds", [None, [], ["a"], ["b"], ("a", "b")], ids=str)
@pytest.mark.parametrize("worker", [None, "w1"])
@pytest.mark.parametrize("setup", [
    {},
    {"create_not_before": T0 - timedelta(seconds=1)},
    {"create_not_before": T0},
    {"create_not_before": T0 + timedelta(microseconds=1)},
    {"provider_call_started_at": T0 - timedelta(hours=3)},
    {"submission_state": Submission.SUBMITTING},
], ids=["plain", "nb-past", "nb-now", "nb-future", "call-started", "submitting"])
def test_claim_create(sessions: sessionmaker[Session], now: datetime, kinds: Any,
                      worker: Any, setup: dict[str, Any]) -> None:
    if now.utcoffset() and sessions.kw["bind"].dialect.name == "sqlite":
        # the one known difference: the old SQLite claim stored provider_call_started_at as
        # the offset's wall time; the prepared bind stores UTC (test_attack_prepared_sqlite_offset)
        job_id = _insert(sessions, **setup)
        with sessions.begin() as s:
            got = jobstore.claim_create(s, job_id, "tok", now, timedelta(minutes=5),
                                        kinds=kinds, worker=worker)
            called = got.provider_call_started_at if got is not None else None
        if got is not None:
            assert called == setup.get("provider_call_started_at", now).astimezone(UTC)
        else:
            assert _row(sessions, job_id)["claim_token"] is None
        return
    row, got = _twin(sessions, old_claim_create, jobstore.claim_create, setup, "tok", now,
                     timedelta(minutes=5), kinds=kinds, worker=worker)
    if got is not None:
        assert row["claim_token"] == "tok" and row["claimed_by"] == worker


@pytest.mark.parametrize("now", NOWS, ids=["utc", "plus5"])
@pytest.mark.parametrize("due", [None, T0 + timedelta(seconds=30)], ids=["chain", "batch"])
@pytest.mark.parametrize("token", ["tok", "other"])
@pytest.mark.parametrize("state", [Submission.SUBMITTING, Submission.UNCERTAIN,
                                   Submission.NOT_STARTED])
@pytest.mark.parametrize("with_event", [True, False])
def test_save_task_id(sessions: sessionmaker[Session], now: datetime, due: Any, token: str,
                      state: str, with_event: bool) -> None:
    setup = {"submission_state": state, "claim_token": "tok", "poll_generation": 3,
             "poll_seq": 4, "reconcile_attempts": 2, "error_code": "x",
             "reconcile_last_attempt_at": T0 - timedelta(hours=1)}

    def call(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(s: Session, job_id: uuid.UUID) -> Any:
            event = _running(job_id, now) if with_event else None
            got = fn(s, job_id, token, "task-1", now, timedelta(minutes=2), poll_due_at=due,
                     event=event)
            s.flush()
            if event is not None:
                assert (event.id is not None) == (got is not None)
                assert (event.job_id, event.user_id) == (job_id, uuid.UUID(int=7))
            return got
        return run

    _twin(sessions, call(old_save_task_id), call(jobstore.save_task_id), setup)
    with sessions() as s:
        events = [s.execute(select(JobEvent.type, JobEvent.payload, JobEvent.created_at,
                                   JobEvent.published_at, JobEvent.user_id)
                            .where(JobEvent.job_id == j)).all() for j in LAST]
    assert events[0] == events[1]
    assert len(events[0]) == (1 if with_event and token == "tok" and state != "not_started"
                              else 0)


# --- the create step's narrow forms (``columns=``): the same write, only those columns back ---

CLAIM_COLUMNS = ("provider_kind", "provider_model", "input_data", "provider_options",
                 "provider_call_started_at", "claim_token", "started_at")
SAVE_COLUMNS = ("poll_generation", "provider_call_started_at", "poll_due_at",
                "poll_lease_expires_at")


def _columns_of(got: Any, columns: tuple[str, ...]) -> dict[str, Any] | None:
    """A mapped Job's or a Core row's ``columns`` (a row has its columns as attributes)."""
    return None if got is None else {c: getattr(got, c) for c in columns}


@pytest.mark.parametrize("now", NOWS, ids=["utc", "plus5"])
@pytest.mark.parametrize("kinds", [None, ["a"], ["b"]], ids=str)
@pytest.mark.parametrize("setup", [
    {},
    {"create_not_before": T0 + timedelta(microseconds=1)},
    {"provider_call_started_at": T0 - timedelta(hours=3)},
    {"submission_state": Submission.SUBMITTING},
], ids=["plain", "nb-future", "call-started", "submitting"])
def test_claim_create_columns_writes_the_same_row_and_returns_those_columns(
        sessions: sessionmaker[Session], now: datetime, kinds: Any,
        setup: dict[str, Any]) -> None:
    def full(s: Session, job_id: uuid.UUID) -> Any:
        return _columns_of(jobstore.claim_create(s, job_id, "tok", now, timedelta(minutes=5),
                                                 kinds=kinds, worker="w"), CLAIM_COLUMNS)

    def narrow(s: Session, job_id: uuid.UUID) -> Any:
        row = jobstore.claim_create(s, job_id, "tok", now, timedelta(minutes=5), kinds=kinds,
                                    worker="w", columns=CLAIM_COLUMNS)
        assert row is None or not isinstance(row, Job)
        return _columns_of(row, CLAIM_COLUMNS)

    row, got = _twin(sessions, full, narrow, setup)
    claimable = "create_not_before" not in setup and "submission_state" not in setup \
        and kinds != ["b"]
    assert (got is not None) == claimable
    if got is not None:
        assert got["claim_token"] == row["claim_token"] == "tok"


@pytest.mark.parametrize("now", NOWS, ids=["utc", "plus5"])
@pytest.mark.parametrize("due", [None, T0 + timedelta(seconds=30)], ids=["chain", "batch"])
@pytest.mark.parametrize("token", ["tok", "other"])
@pytest.mark.parametrize("state", [Submission.SUBMITTING, Submission.UNCERTAIN])
@pytest.mark.parametrize("with_event", [True, False])
def test_save_task_id_columns_writes_the_same_row_and_event_and_returns_those_columns(
        sessions: sessionmaker[Session], now: datetime, due: Any, token: str, state: str,
        with_event: bool) -> None:
    setup = {"submission_state": state, "claim_token": "tok", "poll_generation": 3,
             "poll_seq": 4, "provider_call_started_at": T0 - timedelta(minutes=1)}

    def call(columns: tuple[str, ...] | None) -> Callable[..., Any]:
        def run(s: Session, job_id: uuid.UUID) -> Any:
            event = _running(job_id, now) if with_event else None
            got = jobstore.save_task_id(s, job_id, token, "task-1", now, timedelta(minutes=2),
                                        poll_due_at=due, event=event, columns=columns)
            s.flush()
            if event is not None:
                assert (event.id is not None) == (got is not None)
                assert (event.job_id, event.user_id) == (job_id, uuid.UUID(int=7))
            return _columns_of(got, SAVE_COLUMNS)
        return run

    _, got = _twin(sessions, call(None), call(SAVE_COLUMNS), setup)
    assert (got is not None) == (token == "tok")
    if got is not None:
        assert got["poll_generation"] == 4
    with sessions() as s:
        events = [s.execute(select(JobEvent.type, JobEvent.payload, JobEvent.created_at,
                                   JobEvent.published_at, JobEvent.user_id, JobEvent.job_id)
                            .where(JobEvent.job_id == j)).all() for j in LAST]
    assert [e[:5] for e in events[0]] == [e[:5] for e in events[1]]
    assert len(events[1]) == (1 if with_event and token == "tok" else 0)


@pytest.mark.parametrize("now", NOWS, ids=["utc", "plus5"])
@pytest.mark.parametrize("last", [None, T0 - timedelta(seconds=30), T0 - timedelta(seconds=10),
                                  T0 - timedelta(seconds=9, microseconds=999999), T0],
                         ids=["none", "old", "exact", "recent", "now"])
@pytest.mark.parametrize("status", ["pending", "processing", "completed"])
def test_claim_attempt(sessions: sessionmaker[Session], now: datetime, last: Any,
                       status: str) -> None:
    _twin(sessions, old_claim_attempt, jobstore.claim_attempt,
          {"status": status, "reconcile_last_attempt_at": last, "reconcile_attempts": 2,
           "reconcile_last_error": "kept"},
          now, timedelta(seconds=10))


@pytest.mark.parametrize("now", NOWS, ids=["utc", "plus5"])
@pytest.mark.parametrize("setup", [
    {"provider_task_id": "t"},
    {"provider_task_id": "t", "poll_due_at": T0},
    {},
    {"provider_task_id": "t", "status": "failed"},
    {"provider_task_id": "t", "poll_generation": 5, "poll_seq": 3},
], ids=["due-none", "due-set", "no-task", "failed", "gen5"])
def test_make_due(sessions: sessionmaker[Session], now: datetime, setup: dict[str, Any]) -> None:
    _twin(sessions, old_make_due, jobstore.make_due, {"status": "processing", **setup}, now,
          timedelta(minutes=3))


@pytest.mark.parametrize("now", NOWS, ids=["utc", "plus5"])
@pytest.mark.parametrize("counted", [False, True])
@pytest.mark.parametrize("claim", [None, (2, 1), (2, 0), (1, 1)], ids=str)
@pytest.mark.parametrize("setup", [
    {},
    {"storing_until": T0 - timedelta(seconds=1), "storing_count": 3},
    {"storing_until": T0, "storing_count": 3},
    {"storing_until": T0 + timedelta(seconds=1), "storing_count": 3},
    {"storing_until": T0 + timedelta(hours=1), "storing_count": None},
    {"poll_due_at": T0 + timedelta(seconds=5)},
    {"poll_lease_expires_at": T0 + timedelta(seconds=5)},
    {"status": "completed"},
], ids=["none", "ended", "ends-now", "lasts", "lasts-uncounted", "batch", "chain", "done"])
def test_hold_while_storing(sessions: sessionmaker[Session], now: datetime, counted: bool,
                            claim: Any, setup: dict[str, Any]) -> None:
    base = {"status": "processing", "provider_task_id": "t", "poll_generation": 2,
            "poll_seq": 1, **setup}
    until = now + timedelta(minutes=10)
    _twin(sessions, old_hold_while_storing, jobstore.hold_while_storing, base, until,
          claim=claim, now=now, counted=counted)
