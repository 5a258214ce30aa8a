"""Attack on submit's and the create id save's one statement on PostgreSQL (the job row and its
``queued`` event: ``jobstore.insert_job_with_event``; the id save and its ``running`` event:
``jobstore.cas._cas_with_event_prepared``).

A lost id save writes no ``running`` event and publishes nothing: a wrong token, a job resolved
meanwhile, a second create answer, and the same writers interleaved on real PostgreSQL (one
writer paused after its statement, holding its row lock, the other run until it waits on the
lock). The row the save returns carries what it wrote even when the session loaded it first
(both poll modes). A platform-shaped ``jobs`` table (other column order, extra NOT NULL columns
with defaults, naive timestamps, a database in another zone) and odd data get the rows the
ORM's two statements wrote; a replayed idempotency key and a refused reserve write nothing.
The published messages are the stored rows, marked published.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, event, select, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, jobstore, lifecycle
from reconcile.db.migrate import upgrade
from reconcile.db.models import CreditAnomaly, Job, JobEvent, UsageLog
from reconcile.db.session import make_engine, make_sessionmaker
from reconcile.errors import InsufficientCredits
from reconcile.jobstore import cas, create as jobstore_create
from reconcile.jobstore.events import new_event
from reconcile.lifecycle import create as lifecycle_create
from reconcile.lifecycle.cancel import cancel_job
from reconcile.lifecycle.poll import first_due, poll_lease
from reconcile.states import CREATE_CLAIM_LEASE
from reconcile.testing.platform_schema import set_database_timezone
from reconcile.testing.simulator import Simulator
from tests.conftest import PG_ADMIN_URL, TABLES, PgDatabases
from tests.integration.harness import Clock, Queues, fund, make_runtime

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KIND = "kie-standard"
MODEL = "seedream/4.5-edit"


class Pauser:
    """Thread ``A`` waits for ``go`` after its first statement containing ``marker``."""

    def __init__(self, engine: Engine) -> None:
        self.marker: str | None = None
        self.autocommit = False  # A's statement committed itself (db.session.one_statement)
        self.paused = threading.Event()
        self.go = threading.Event()
        self.engine = engine
        event.listen(engine, "after_cursor_execute", self._after)

    def arm(self, marker: str) -> None:
        self.marker = marker
        self.paused.clear()
        self.go.clear()

    def _after(self, conn: Any, _cursor: Any, statement: str, *args: Any) -> None:
        if threading.current_thread().name != "A" or self.marker is None:
            return
        if self.marker in statement:
            self.marker = None
            self.autocommit = bool(conn.connection.dbapi_connection.autocommit)
            self.paused.set()
            assert self.go.wait(60)

    def close(self) -> None:
        event.remove(self.engine, "after_cursor_execute", self._after)


@pytest.fixture(scope="module")
def pg(pg_databases: PgDatabases) -> Iterator[tuple[sessionmaker[Session], Engine, Pauser]]:
    url = pg_databases.create("scattack")
    upgrade(url)
    engine = make_engine(url)
    pauser = Pauser(engine)
    yield make_sessionmaker(engine), engine, pauser
    pauser.close()
    engine.dispose()


@dataclass
class W:
    rt: Runtime
    q: Queues
    db: sessionmaker[Session]
    engine: Engine
    pauser: Pauser
    clock: Clock
    user: uuid.UUID = field(default_factory=uuid.uuid4)
    seen: list[dict[str, Any]] = field(default_factory=list)

    def submit(self, credits_: int = 10, **kw: Any) -> uuid.UUID:
        return lifecycle.submit_job(self.rt, self.user, KIND, MODEL, kw.pop("input", {"prompt": "c"}),
                                    credits_, job_type="image", enqueue=False, **kw).job_id

    def claim(self, job_id: uuid.UUID) -> str:
        token = uuid.uuid4().hex
        with self.db.begin() as s:
            assert jobstore.claim_create(s, job_id, token, self.clock(), CREATE_CLAIM_LEASE)
        return token

    def events(self, job_id: uuid.UUID, type_: str | None = None) -> list[JobEvent]:
        with self.db() as s:
            stmt = select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            return [e for e in s.execute(stmt).scalars() if type_ in (None, e.type)]

    def job(self, job_id: uuid.UUID) -> Job:
        with self.db() as s:
            found = s.get(Job, job_id)
            assert found is not None
            return found

    def anomalies(self, job_id: uuid.UUID) -> list[str]:
        with self.db() as s:
            return sorted(s.execute(select(CreditAnomaly.kind)
                                    .where(CreditAnomaly.job_id == job_id)).scalars())


def _world(pg: tuple[sessionmaker[Session], Engine, Pauser], sim: Simulator, tmp: Path,
           **settings: Any) -> W:
    factory, engine, pauser = pg
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE " + ", ".join(TABLES)))
    clock = Clock(T0)
    rt, q = make_runtime(factory, sim, tmp, clock=clock, **settings)
    w = W(rt, q, factory, engine, pauser, clock)
    rt.event_hooks.append(w.seen.append)
    fund(factory, w.user, 1000)
    return w


@pytest.fixture
def w(pg: Any, simulator: Simulator, tmp_path: Path) -> W:
    return _world(pg, simulator, tmp_path)


def _kind(rt: Runtime) -> Any:
    return rt.kind(KIND)


# --- a lost save writes nothing ------------------------------------------------------------


@pytest.mark.parametrize("known_kind", [True, False], ids=["kind", "load_first"])
@pytest.mark.parametrize("case", ["token", "resolved", "same_id", "other_id"])
def test_a_lost_save_writes_no_running_event_and_publishes_nothing(w: W, case: str,
                                                                   known_kind: bool) -> None:
    job_id = w.submit()
    token = w.claim(job_id)
    kind = _kind(w.rt) if known_kind else None
    if case == "resolved":  # the claim expired, the sweep marked it, an operator resolved it
        w.clock.advance(seconds=CREATE_CLAIM_LEASE.total_seconds() + 60)
        with w.db.begin() as s:
            assert jobstore.mark_uncertain(s, job_id, token=None, now=w.clock(), code="X",
                                           detail=None)
        assert lifecycle.resolve_not_submitted(w.rt, job_id)
    elif case in ("same_id", "other_id"):  # a first answer saved its id
        assert lifecycle.on_task_created(w.rt, job_id, token, "task-1", kind=kind)
    before = [(e.type, e.event_id) for e in w.events(job_id)]
    seen = len(w.seen)
    job_before = w.job(job_id)
    answer = "task-1" if case == "same_id" else "task-2"
    saved = lifecycle.on_task_created(w.rt, job_id, "not-the-token" if case == "token" else token,
                                      answer, kind=kind)
    assert saved is (case == "same_id")
    assert [(e.type, e.event_id) for e in w.events(job_id)] == before
    assert len(w.seen) == seen
    after = w.job(job_id)
    assert (after.status, after.provider_task_id, after.poll_generation) == (
        job_before.status, job_before.provider_task_id, job_before.poll_generation)
    expected = {"token": ["task_id_conflict"], "same_id": [], "other_id": ["task_id_conflict"],
                "resolved": ["accepted_after_terminal"]}[case]
    assert w.anomalies(job_id) == expected


# --- interleaved on real PostgreSQL --------------------------------------------------------


def _run(name: str, fn: Callable[[], Any], out: dict[str, Any]) -> threading.Thread:
    def body() -> None:
        try:
            out[name] = fn()
        except BaseException as exc:  # reported by the test
            out[name] = exc

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    return thread


def _wait_for_lock_waiter(engine: Engine) -> None:
    deadline = time.monotonic() + 30
    with engine.connect() as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'")).scalar()
            conn.rollback()
            if waiting:
                return
            time.sleep(0.02)
    raise AssertionError("the second writer never waited on the row lock")


def _interleave(w: W, first: Callable[[], Any], marker: str, second: Callable[[], Any]) -> dict[str, Any]:
    """``first`` (thread A) paused after its statement holding ``marker``; ``second`` run until
    it waits on the row lock; then both finish. A statement that committed itself (a
    one-statement transaction in autocommit) holds no lock while A is paused: ``second`` then
    runs to its end first, against the committed write."""
    out: dict[str, Any] = {}
    w.pauser.arm(marker)
    a = _run("A", first, out)
    while not w.pauser.paused.wait(0.05):
        assert a.is_alive(), out  # A ended (or raised) without reaching its statement
    b = _run("B", second, out)
    if w.pauser.autocommit:
        b.join(30)
        assert not b.is_alive(), "B waited on a write that was already committed"
    else:
        _wait_for_lock_waiter(w.engine)
    w.pauser.go.set()
    a.join(30)
    b.join(30)
    assert not a.is_alive() and not b.is_alive()
    for value in out.values():
        if isinstance(value, BaseException):
            raise value
    return out


def _expired_uncertain(w: W) -> tuple[uuid.UUID, str]:
    job_id = w.submit()
    token = w.claim(job_id)
    w.clock.advance(seconds=CREATE_CLAIM_LEASE.total_seconds() + 60)
    with w.db.begin() as s:
        assert jobstore.mark_uncertain(s, job_id, token=None, now=w.clock(), code="X", detail=None)
    return job_id, token


def _save(w: W, job_id: uuid.UUID, token: str, task_id: str) -> Callable[[], bool]:
    return lambda: lifecycle.on_task_created(w.rt, job_id, token, task_id, kind=_kind(w.rt))


def _sweep_mark(w: W, job_id: uuid.UUID) -> Callable[[], Any]:
    def mark() -> Any:
        with w.db.begin() as s:
            return jobstore.mark_uncertain(s, job_id, token=None, now=w.clock(), code="X",
                                           detail=None) is not None
    return mark


def test_resolved_first_then_the_save_waits_and_loses(w: W) -> None:
    job_id, token = _expired_uncertain(w)
    out = _interleave(w, lambda: lifecycle.resolve_not_submitted(w.rt, job_id), "UPDATE jobs",
                      _save(w, job_id, token, "task-1"))
    assert out == {"A": True, "B": False}
    assert [e.type for e in w.events(job_id)] == ["queued", "failed"]
    assert [m["type"] for m in w.seen if m["job_id"] == str(job_id)] == ["queued", "failed"]
    job = w.job(job_id)
    assert (job.status, job.provider_task_id) == ("failed", None)
    assert w.anomalies(job_id) == ["accepted_after_terminal"]


def test_the_save_first_then_the_resolve_waits_and_loses(w: W) -> None:
    job_id, token = _expired_uncertain(w)
    out = _interleave(w, _save(w, job_id, token, "task-1"), "UPDATE jobs",
                      lambda: lifecycle.resolve_not_submitted(w.rt, job_id))
    assert out == {"A": True, "B": False}
    running = w.events(job_id, "running")
    assert len(running) == 1 and running[0].payload == {"provider_task_id": "task-1"}
    assert running[0].published_at is not None
    job = w.job(job_id)
    assert (job.status, job.provider_task_id, job.poll_generation) == ("processing", "task-1", 1)


@pytest.mark.parametrize("order", ["mark_first", "save_first"])
def test_the_sweeps_uncertain_marking_and_the_save(w: W, order: str) -> None:
    job_id = w.submit()
    token = w.claim(job_id)
    w.clock.advance(seconds=CREATE_CLAIM_LEASE.total_seconds() + 60)
    if order == "mark_first":
        out = _interleave(w, _sweep_mark(w, job_id), "UPDATE jobs", _save(w, job_id, token, "t-1"))
        assert out == {"A": True, "B": True}
    else:
        out = _interleave(w, _save(w, job_id, token, "t-1"), "UPDATE jobs", _sweep_mark(w, job_id))
        assert out == {"A": True, "B": False}
    job = w.job(job_id)
    assert (job.status, job.submission_state, job.provider_task_id, job.error_code,
            job.poll_generation) == ("processing", "accepted", "t-1", None, 1)
    assert len(w.events(job_id, "running")) == 1
    assert [m["type"] for m in w.seen if m["job_id"] == str(job_id)] == ["queued", "running"]


@pytest.mark.parametrize("second", ["t-1", "t-2"])
def test_two_create_answers_at_once_write_one_running_event(w: W, second: str) -> None:
    job_id = w.submit()
    token = w.claim(job_id)
    out = _interleave(w, _save(w, job_id, token, "t-1"), "UPDATE jobs",
                      _save(w, job_id, token, second))
    assert out == {"A": True, "B": second == "t-1"}
    running = w.events(job_id, "running")
    assert [e.payload for e in running] == [{"provider_task_id": "t-1"}]
    assert [m["type"] for m in w.seen if m["job_id"] == str(job_id)] == ["queued", "running"]
    assert w.job(job_id).poll_generation == 1
    assert w.anomalies(job_id) == ([] if second == "t-1" else ["task_id_conflict"])
    assert len(w.q.polls) == 1



@pytest.mark.parametrize("answer", ["t-1", "t-2"])
def test_the_users_cancel_holding_the_row_and_a_second_create_answer(w: W, answer: str) -> None:
    job_id = w.submit()
    token = w.claim(job_id)
    assert _save(w, job_id, token, "t-1")()
    out = _interleave(w, lambda: cancel_job(w.rt, w.user, job_id).status,
                      "UPDATE jobs", _save(w, job_id, token, answer))
    assert out == {"A": "cancelled", "B": answer == "t-1"}
    assert [e.type for e in w.events(job_id)] == ["queued", "running", "cancel_requested",
                                                  "canceled"]
    assert [m["type"] for m in w.seen] == ["queued", "running", "cancel_requested", "canceled"]
    assert w.anomalies(job_id) == ([] if answer == "t-1" else ["task_id_conflict"])
    assert len(w.q.polls) == 1

# --- the row the save returns --------------------------------------------------------------


def test_the_saved_row_overrides_what_the_session_loaded_before(w: W) -> None:
    job_id = w.submit()
    token = w.claim(job_id)
    running = new_event(Job(id=job_id), "running", T0, {"provider_task_id": "t-9"})
    with w.db.begin() as s:
        loaded = s.get(Job, job_id)
        assert loaded is not None and loaded.poll_generation == 0
        with w.engine.begin() as other:  # moved on by another writer after the load
            other.execute(text("UPDATE jobs SET poll_generation = 5, progress = 7 WHERE id = :j"),
                          {"j": job_id})
        saved = jobstore.save_task_id(s, job_id, token, "t-9", T0, timedelta(seconds=30),
                                      event=running)
        assert saved is loaded  # the session's one object, with the values written
        assert (saved.status, saved.submission_state, saved.provider_task_id,
                saved.poll_generation, saved.progress, saved.claim_expires_at,
                saved.poll_lease_expires_at) == ("processing", "accepted", "t-9", 6, 7, None,
                                                 T0 + timedelta(seconds=30))
        assert running.id is not None and (running.job_id, running.user_id) == (job_id, w.user)
        assert s.get(JobEvent, running.id) is not None  # the id is the stored row's
    assert w.job(job_id).poll_generation == 6


@pytest.mark.parametrize("mode", ["chain", "batch"])
@pytest.mark.parametrize("known_kind", [True, False], ids=["kind", "load_first"])
def test_the_create_step_after_the_save_sees_what_was_written(pg: Any, simulator: Simulator,
                                                              tmp_path: Path, mode: str,
                                                              known_kind: bool) -> None:
    w = _world(pg, simulator, tmp_path, poll_mode=mode)
    job_id = w.submit()
    token = w.claim(job_id)
    with w.engine.begin() as other:  # an earlier chain: the save starts the next generation
        other.execute(text("UPDATE jobs SET poll_generation = 3 WHERE id = :j"), {"j": job_id})
    w.clock.advance(seconds=2)
    kind = _kind(w.rt)
    assert lifecycle.on_task_created(w.rt, job_id, token, "t-1", kind=kind if known_kind else None)
    job = w.job(job_id)
    assert (job.status, job.provider_task_id, job.poll_generation) == ("processing", "t-1", 4)
    assert job.poll_lease_expires_at == w.clock() + poll_lease(w.rt, kind)
    if mode == "batch":
        assert job.poll_due_at == first_due(w.rt, kind, w.clock()) and not w.q.polls
    else:
        assert job.poll_due_at is None and list(w.q.polls) == [(job_id, 4, 0)]
    (running,) = w.events(job_id, "running")
    message = next(m for m in w.seen if m["type"] == "running")
    assert message == {"event_id": running.event_id, "job_id": str(job_id), "type": "running",
                       "payload": {"provider_task_id": "t-1"},
                       "created_at": w.clock().isoformat()}
    assert running.published_at == w.clock() and running.created_at == w.clock()
    assert running.user_id == w.user


# --- a platform-shaped table, another zone, odd data: the rows the ORM path wrote ----------

PLATFORM_JOBS = """CREATE TABLE jobs (
  tenant text NOT NULL DEFAULT 'acme', seq bigint GENERATED ALWAYS AS IDENTITY,
  completed_at timestamp, started_at timestamp, created_at timestamp NOT NULL DEFAULT now(),
  updated_at timestamp NOT NULL DEFAULT now(), display_cost bigint,
  provider_cost numeric(12,6), provider text, node_id text, workflow_execution_id uuid,
  is_public boolean, should_watermark boolean, progress int NOT NULL DEFAULT 0,
  error_message text, output_data jsonb, input_data jsonb NOT NULL DEFAULT '{}',
  status varchar(32) NOT NULL, job_type varchar(100) NOT NULL, user_id uuid NOT NULL,
  id uuid PRIMARY KEY)"""
# timestamps compared as the text PostgreSQL stores (a naive column keeps the wall time)
JOB_TEXT = ("SELECT to_jsonb(j) - 'id' - 'seq' - 'updated_at' - 'claim_token' AS row, "
            "created_at::text, started_at::text, poll_lease_expires_at::text, "
            "provider_call_started_at::text FROM jobs j WHERE id = :j")
EVENT_TEXT = ("SELECT type, payload, user_id, created_at::text, published_at IS NULL "
              "FROM reconcile_job_events WHERE job_id = :j ORDER BY id")


@pytest.fixture(scope="module")
def platform(pg_databases: PgDatabases) -> Iterator[tuple[sessionmaker[Session], Engine, Pauser]]:
    url = pg_databases.create("scplatform")
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"),
                         autocommit=True) as conn:
        conn.execute(PLATFORM_JOBS)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        set_database_timezone(admin, url.rsplit("/", 1)[1], "Asia/Kolkata")
    upgrade(url)
    engine = make_engine(url)
    pauser = Pauser(engine)
    yield make_sessionmaker(engine), engine, pauser
    pauser.close()
    engine.dispose()


def _orm_insert(session: Session, values: dict[str, Any], event: JobEvent) -> None:
    """The two-statement path: the ORM's job row flushed, its event added (flushed later)."""
    jobstore.insert_job(session, **values)
    session.flush()
    session.add(event)


def _orm_cas_with_event(session: Session, event: JobEvent, *where: Any, **values: Any) -> Any:
    """The two-statement path: the CAS, then the ORM's event row for the row it wrote."""
    row = cas._cas(session, *where, **values)
    if row is not None:
        event.job_id, event.user_id = row.id, row.user_id
        session.add(event)
    return row


def _orm_save_prepared(session: Session, event: JobEvent, shape: Any, params: Any) -> Any:
    """The two-statement path of the save, with the values themselves, not bind parameters:
    the prepared statement's shape is never used."""
    where = jobstore_create._owner(params["s_job_id"], params["s_token"])
    values = jobstore_create._saved(params["s_task_id"], params["s_lease_until"],
                                    params["s_due_at"])
    return _orm_cas_with_event(session, event, *where, **values)


ODD_INPUT: dict[str, Any] = {
    "prompt": "猫 🐈‍⬛ \u202e naïve \u2028 \"quoted\" \\ back", "big": 2**80, "neg": -(2**70),
    "float": 1.5e300, "tiny": 5e-324, "nested": {"a": [1, {"b": [None, True, {"c": "ü"}]}]},
    "empty": {}, "list": [], "zero": 0, "ключ": "значение",
}
ODD = dict(input=ODD_INPUT, node_id="ノード-1", is_public=True,
           workflow_execution_id=uuid.UUID(int=77),
           options={"webhook_events_filter": ["completed"], "label": "𝔘𝔫𝔦"})


def _one_job(w: W, task_id: str, odd: bool) -> tuple[Any, ...]:
    job_id = w.submit(**(ODD if odd else {}))
    token = w.claim(job_id)
    w.clock.advance(seconds=1)
    assert lifecycle.on_task_created(w.rt, job_id, token, task_id, kind=None)
    with w.db() as s:
        row = s.execute(text(JOB_TEXT), {"j": job_id}).one()
        events = s.execute(text(EVENT_TEXT), {"j": job_id}).all()
        extra = s.execute(text("SELECT to_jsonb(j) ->> 'tenant' FROM jobs j WHERE id = :j"),
                          {"j": job_id}).scalar()
    return tuple(row), [tuple(e) for e in events], extra, [m["payload"] for m in w.seen]


@pytest.mark.parametrize("database", ["library", "platform"])
@pytest.mark.parametrize("odd", [False, True], ids=["plain", "odd"])
def test_submit_and_save_write_the_rows_the_orm_path_wrote(
        request: pytest.FixtureRequest, simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, database: str, odd: bool) -> None:
    shape = request.getfixturevalue("pg" if database == "library" else "platform")
    task_id = "タスク-✓-" + "x" * 40
    w = _world(shape, simulator, tmp_path)
    w.user = uuid.UUID(int=5)
    fund(w.db, w.user, 1000)
    one_statement = _one_job(w, task_id, odd)
    w = _world(shape, simulator, tmp_path)
    w.user = uuid.UUID(int=5)
    fund(w.db, w.user, 1000)
    monkeypatch.setattr(jobstore, "insert_job_with_event", _orm_insert)
    monkeypatch.setattr(jobstore_create, "_cas_with_event_prepared", _orm_save_prepared)
    # two statements are no one-statement transaction: an ordinary one, as before autocommit
    monkeypatch.setattr(lifecycle_create, "one_statement", lambda factory: factory.begin())
    two_statements = _one_job(w, task_id, odd)
    assert one_statement == two_statements
    row, events, extra, _published = one_statement
    if database == "platform":  # the naive columns hold UTC wall time in Asia/Kolkata
        assert row[1] == "2026-03-01 12:00:00" and row[2] == "2026-03-01 12:00:00"
        assert extra == "acme"
    assert [e[0] for e in events] == ["queued", "running"]
    assert events[1][1] == {"provider_task_id": task_id}
    if odd:
        exact = {k: v for k, v in ODD_INPUT.items() if k not in ("float", "tiny")}  # jsonb numeric
        assert {k: row[0]["input_data"][k] for k in exact} == exact
        assert row[0]["node_id"] == "ノード-1"


def _written(w: W) -> tuple[int, int, int, list[Any]]:
    with w.db() as s:
        count = lambda model: s.execute(select(model.id)).all()  # noqa: E731
        balances = s.execute(text("SELECT sub, topup FROM reconcile_credit_balances")).all()
        return len(count(Job)), len(count(JobEvent)), len(count(UsageLog)), balances


@pytest.mark.parametrize("bad", ["node_id", "options"])
def test_a_nul_the_database_refuses_fails_as_the_orm_path_did(
        w: W, monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    kw: dict[str, Any] = {"node_id": "a\x00b"} if bad == "node_id" else {"options": {"k": "\x00"}}
    before = _written(w)
    with pytest.raises(Exception) as one:
        w.submit(**kw)
    assert _written(w) == before and w.seen == []
    monkeypatch.setattr(jobstore, "insert_job_with_event", _orm_insert)
    with pytest.raises(Exception) as two:
        w.submit(**kw)
    assert type(one.value) is type(two.value)
    assert _written(w) == before and w.seen == []


def test_a_replayed_key_inserts_and_reserves_nothing(w: W) -> None:
    first = lifecycle.submit_job(w.rt, w.user, KIND, MODEL, {"prompt": "c"}, 10,
                                 job_type="image", enqueue=False, idempotency_key="k-1")
    after_first = _written(w)
    assert after_first[:3] == (1, 1, 1) and len(w.seen) == 1
    again = lifecycle.submit_job(w.rt, w.user, KIND, MODEL, {"prompt": "c"}, 10,
                                 job_type="image", enqueue=False, idempotency_key="k-1")
    assert again.replay is not None and again.job_id == first.job_id
    assert _written(w) == after_first and len(w.seen) == 1



def test_two_submits_with_one_key_at_once_write_one_job_and_reserve_once(w: W) -> None:
    def submit() -> tuple[uuid.UUID, bool]:
        done = lifecycle.submit_job(w.rt, w.user, KIND, MODEL, {"prompt": "c"}, 10,
                                    job_type="image", enqueue=False, idempotency_key="k-9")
        return done.job_id, done.replay is not None

    before = _written(w)
    out = _interleave(w, submit, "INSERT INTO jobs", submit)
    assert out["A"][1] is False and out["B"] == (out["A"][0], True)
    jobs, events, logs, balances = _written(w)
    assert (jobs, events, logs) == (before[0] + 1, before[1] + 1, before[2] + 1)
    assert balances == [(990, 0)]
    assert [m["type"] for m in w.seen] == ["queued"]

@pytest.mark.parametrize("key", [None, "k-2"])
def test_a_refused_reserve_leaves_neither_the_job_nor_its_event(w: W, key: str | None) -> None:
    before = _written(w)
    job_id = uuid.uuid4()
    with pytest.raises(InsufficientCredits):
        lifecycle.submit_job(w.rt, w.user, KIND, MODEL, {"prompt": "c"}, 10**6, job_type="image",
                             enqueue=False, job_id=job_id, idempotency_key=key)
    assert _written(w) == before and w.seen == [] and w.events(job_id) == []
    # the same id and key then go through once there are credits
    fund(w.db, w.user, 10**6)
    done = lifecycle.submit_job(w.rt, w.user, KIND, MODEL, {"prompt": "c"}, 10**6,
                                job_type="image", enqueue=False, job_id=job_id,
                                idempotency_key=key)
    assert done.job_id == job_id and done.replay is None
    assert [e.type for e in w.events(job_id)] == ["queued"]
    (message,) = w.seen
    (stored,) = w.events(job_id)
    assert message == {"event_id": stored.event_id, "job_id": str(job_id), "type": "queued",
                       "payload": {}, "created_at": T0.isoformat()}
    assert stored.user_id == w.user and stored.published_at == T0


# --- the published messages ----------------------------------------------------------------


def test_redis_gets_the_stored_events_on_the_users_channel_and_a_failed_hook_is_retried(
        pg: Any, simulator: Simulator, tmp_path: Path, redis_url: str) -> None:
    import json

    import redis

    w = _world(pg, simulator, tmp_path, events_redis_url=redis_url)
    job_id = uuid.uuid4()
    pubsub = redis.Redis.from_url(redis_url).pubsub()
    pubsub.subscribe(f"reconcile:user:{w.user}")
    pubsub.get_message(timeout=1)
    fails = [True]

    def flaky(message: dict[str, Any]) -> None:
        if message["type"] == "running" and fails.pop():
            raise RuntimeError("down")

    w.rt.event_hooks.insert(0, flaky)
    lifecycle.submit_job(w.rt, w.user, KIND, MODEL, {"prompt": "c"}, 10, job_type="image",
                         enqueue=False, job_id=job_id)
    token = w.claim(job_id)
    assert lifecycle.on_task_created(w.rt, job_id, token, "t-1", kind=_kind(w.rt))
    queued, running = w.events(job_id)
    assert queued.published_at == T0 and running.published_at is None  # the hook failed
    fails.append(False)
    assert jobstore.events.publish(w.rt, job_id=job_id) == 1
    assert w.events(job_id, "running")[0].published_at == T0
    received: list[dict[str, Any]] = []
    deadline = time.time() + 5
    while len(received) < 2 and time.time() < deadline:
        m = pubsub.get_message(timeout=0.5)
        if m and m["type"] == "message":
            received.append(json.loads(m["data"]))
    pubsub.close()
    assert [(m["event_id"], m["job_id"], m["type"], m["payload"]) for m in received] == [
        (queued.event_id, str(job_id), "queued", {}),
        (running.event_id, str(job_id), "running", {"provider_task_id": "t-1"})]
    assert [m["event_id"] for m in w.seen] == [queued.event_id, running.event_id]
