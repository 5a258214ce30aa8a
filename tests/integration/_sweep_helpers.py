"""The sweep tests' world: a runtime on the test database, the simulator, a settable clock
and a funded user (``World``), on each ledger backend in turn (the ``world`` fixture), and the
checks they share.

Shared by every ``test_sweep_*`` file and by other integration files that drive the sweep. A test
module uses the fixture by importing it, ``from tests.integration._sweep_helpers import world as
world`` (pytest finds fixtures in the module's namespace; the ``as`` form tells ruff the name is
used). It is not in ``tests/integration/conftest.py`` because a dozen integration files define a
``world`` fixture of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import (
    CreditAnomaly,
    CreditBalance,
    CreditTransaction,
    Job,
    JobEvent,
    UsageLog,
)
from reconcile.sweep import SweepReport, sweep
from reconcile.testing.simulator import Script, Simulator
from tests.integration import harness
from tests.integration.harness import Clock, fund, make_runtime
from tests.integration.ledgers import BACKENDS, assert_builtin_ledger_untouched, make_backend

INSTANT = ((0.0, "queued"), (0.0, "succeeded"))
FOREVER = ((0.0, "queued"), (1.0, "running"), (10.0**6, "succeeded"))
MODELS = {
    "kie-standard": "seedream/4.5-edit", "kie-veo": "veo3_fast", "kie-lip-sync": "kling/lip-sync",
    "replicate-prediction": "acme/upscaler:v1", "elevenlabs-async": "dubbing",
    "anthropic-sync": "claude-sonnet-4-5", "kie-llm": "gpt-5", "elevenlabs-sync": "tts:voice",
}
# the legacy sweep as first specified: legacy rows enforced, every row here created before the
# cutoff, 5 minutes of age (the library's defaults are observe / adoption time / 165 min)
SEED_PHASE_2: dict[str, Any] = {
    "legacy_sweep": "enforce", "legacy_cutoff": datetime(2999, 1, 1, tzinfo=UTC),
    "legacy_age": timedelta(minutes=5),
}
INPUTS: dict[str, dict[str, Any]] = {
    "elevenlabs-async": {"source_url": "https://example.com/a.mp4", "target_lang": "es"},
}


class World:
    """A runtime on the test database, the simulator, a settable clock and a funded user."""

    def __init__(self, db: sessionmaker[Session], sim: Simulator, tmp: Path, **settings: Any):
        self.db, self.sim, self.clock = db, sim, Clock()
        self.rt, self.q = make_runtime(db, sim, tmp, clock=self.clock,
                                       **{**SEED_PHASE_2, **settings})
        self.user = uuid.uuid4()
        fund(db, self.user, 100_000)

    def submit(self, kind: str, credits_: int = 40, *, job_type: str = "image",
               user: uuid.UUID | None = None, **kw: Any) -> uuid.UUID:
        model = kw.pop("model", MODELS.get(kind, "m/x"))
        return lifecycle.submit_job(self.rt, user or self.user, kind, model,
                                    kw.pop("input", INPUTS.get(kind, {"prompt": "cat"})),
                                    credits_, job_type=job_type, enqueue=False, **kw).job_id

    def accept(self, kind: str, script: Script | None = None, **kw: Any) -> uuid.UUID:
        """Submit and create upstream (the id saved, accepted); the poll chain is then lost."""
        job_id = self.submit(kind, **kw)
        if script is not None:
            self.sim.script(str(job_id), script)
        outcome = lifecycle.create_step(self.rt, job_id)
        assert outcome.action == "accepted", outcome
        self.lose_messages()
        return job_id

    def lose_messages(self) -> None:
        self.q.creates.clear()
        self.q.polls.clear()

    def platform_row(self, credits_: int = 40, *, user: uuid.UUID | None = None,
                     **columns: Any) -> uuid.UUID:
        """A row the library never submitted (``submission_state`` NULL) with a reservation."""
        return self.platform_rows(1, credits_, user=user, **columns)[0]

    def platform_rows(self, count: int, credits_: int = 40, *, user: uuid.UUID | None = None,
                      **columns: Any) -> list[uuid.UUID]:
        ids: list[uuid.UUID] = []
        with self.db.begin() as s:
            for _ in range(count):
                values: dict[str, Any] = dict(id=uuid.uuid4(), user_id=user or self.user,
                                              job_type="image", status="processing",
                                              created_at=self.clock.now)
                values.update(columns)
                s.add(Job(**values))
                s.flush()
                self.rt.ledger.reserve(s, values["user_id"], values["id"], credits_,
                                       now=self.clock.now)
                ids.append(values["id"])
        return ids

    def tick(self, **kw: Any) -> SweepReport:
        return sweep(self.rt, **kw)

    def job(self, job_id: uuid.UUID) -> Job:
        with self.db() as s:
            job = s.get(Job, job_id)
            assert job is not None
            return job

    def set(self, job_id: uuid.UUID, **values: Any) -> None:
        with self.db.begin() as s:
            s.execute(update(Job).where(Job.id == job_id).values(**values))

    def log_status(self, job_id: uuid.UUID) -> str:
        with self.db() as s:
            return s.execute(select(UsageLog.status).where(UsageLog.job_id == job_id)).scalar_one()

    def refunds(self, job_id: uuid.UUID) -> int:
        current = harness.backend()
        if current is not None:
            return current.refund_count(job_id)
        with self.db() as s:
            return s.execute(select(func.count()).select_from(CreditTransaction).where(
                CreditTransaction.job_id == job_id, CreditTransaction.type == "REFUND")).scalar_one()

    def completions(self, job_id: uuid.UUID) -> int:
        """The job's ``completed`` events (one per completion that won)."""
        from reconcile.db.models import JobEvent

        with self.db() as s:
            return s.execute(select(func.count()).select_from(JobEvent).where(
                JobEvent.job_id == job_id, JobEvent.type == "completed")).scalar_one()

    def anomalies(self, job_id: uuid.UUID, kind: str | None = None) -> list[str]:
        with self.db() as s:
            stmt = select(CreditAnomaly.kind).where(CreditAnomaly.job_id == job_id)
            if kind is not None:
                stmt = stmt.where(CreditAnomaly.kind == kind)
            return list(s.execute(stmt).scalars())

    def audit(self) -> list[Any]:
        with self.db() as s:
            return harness.audit(s, now=self.clock.now)

    def pools(self, user: uuid.UUID) -> tuple[int, int]:
        """(sub, topup) of the user's balance in whichever ledger backend runs."""
        current = harness.backend()
        if current is not None:
            return current.balance(user)
        with self.db() as s:
            row = s.get(CreditBalance, user)
            return (0, 0) if row is None else (row.sub, row.topup)

    def task_id(self, job_id: uuid.UUID) -> str:
        task_id = self.job(job_id).provider_task_id
        assert task_id
        return task_id

    def lapse(self, worker: str) -> None:
        """``worker`` registered a minute ago with a 6 s heartbeat timeout, never renewed: its
        heartbeat has lapsed (the reaper takes it)."""
        from reconcile import jobstore

        with self.db.begin() as s:
            jobstore.register_worker(s, worker, "host", 1, self.clock.now - timedelta(minutes=1),
                                     timedelta(seconds=6))

    def miss_once(self, monkeypatch: pytest.MonkeyPatch, job_id: uuid.UUID,
                  inside: Any, stale: Any = None) -> list[int]:
        """The job's next read says "not found" once (a transient miss; ``stale``: that
        ``PollResult`` instead) while its task has succeeded upstream; ``inside()`` runs inside
        that read. Returns the reads of the task (one int each)."""
        from reconcile.providers import PollResult, PollStatus

        task = self.task_id(job_id)
        client = self.rt.client(self.rt.kind(self.job(job_id).provider_kind or ""))
        real = client.poll
        reads: list[int] = []

        def poll(task_id: str, model: str | None = None) -> PollResult:
            if task_id == task:
                reads.append(1)
                if len(reads) == 1:
                    self.sim.set_state(task, "succeeded")
                    inside()
                    return stale if stale is not None else PollResult(PollStatus.NOT_FOUND)
            return real(task_id, model=model)

        monkeypatch.setattr(client, "poll", poll)
        return reads


@pytest.fixture(params=BACKENDS)
def world(request: pytest.FixtureRequest, db: sessionmaker[Session], simulator: Simulator,
          tmp_path: Path) -> Iterator[World]:
    """A world on each ledger backend in turn (built-in; platform user_credits)."""
    with harness.ledger_backend(make_backend(request.param, db)):
        yield World(db, simulator, tmp_path)
    if request.param == "platform":  # the sweep reached credits only through the seam
        assert_builtin_ledger_untouched(db)


def assert_refunded(w: World, job_id: uuid.UUID, code: str = "RECONCILE_NO_RECOVERY") -> Job:
    job = w.job(job_id)
    assert (job.status, job.error_code) == ("failed", code), (job.error_code, job.error_message)
    assert job.credits_actual == 0 and job.next_poll_at is None
    assert w.log_status(job_id) == "refunded" and w.refunds(job_id) == 1
    assert w.audit() == []
    return job


def on_platform_ledger() -> bool:
    current = harness.backend()
    return current is not None and current.name == "platform"


def snapshot(db: sessionmaker[Session]) -> dict[str, Any]:
    """Every row the sweep could touch, as plain values."""
    def rows(s: Session, model: Any, key: Any) -> list[tuple[Any, ...]]:
        cols = [c for c in model.__table__.columns]
        return [tuple(r) for r in s.execute(select(*cols).order_by(key))]

    with db() as s:
        return {
            "jobs": rows(s, Job, Job.id), "logs": rows(s, UsageLog, UsageLog.id),
            "txns": rows(s, CreditTransaction, CreditTransaction.id),
            "balances": rows(s, CreditBalance, CreditBalance.user_id),
            "user_credits": [tuple(r) for r in s.execute(
                text("SELECT * FROM user_credits ORDER BY user_id"))] if on_platform_ledger() else [],
            "anomalies": rows(s, CreditAnomaly, CreditAnomaly.id),
            "events": rows(s, JobEvent, JobEvent.id),
        }


def uncertain_kie(w: World) -> uuid.UUID:
    """A KIE create accepted upstream whose answer was lost: the job is ``uncertain``."""
    job_id = w.submit("kie-standard")
    w.sim.script(str(job_id), Script(timeline=FOREVER, create="drop_after_accept"))
    assert lifecycle.create_step(w.rt, job_id).action == "uncertain"
    return job_id
