"""Adopting the library on a live platform database (issue 14's acceptance), end to end.

The platform's own tables hold, before the migration runs: stuck ``processing`` rows from long
ago, live videos its old workers run, fresh image jobs, ``pipeline`` wrappers, pending rows, a
``user_credits`` balance table and ``reserved`` usage logs (some without a pool split). After the
migration (which records the adoption time) more rows arrive. Then, as an operator would: default
ticks (observe), ``credits import`` + ``audit``, the adoption report, and the enforcing tick.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, Settings
from reconcile.cli import main
from reconcile.db.migrate import upgrade
from reconcile.db.models import CreditBalance, CreditTransaction, Job, ReconcileMeta, UsageLog
from reconcile.db.session import make_engine, make_sessionmaker
from reconcile.storage import LocalStorage
from reconcile.sweep import sweep
from tests.conftest import PgDatabases
from tests.integration.test_migrations import PLATFORM_DDL

BALANCES = "CREATE TABLE user_credits (user_id uuid PRIMARY KEY, sub bigint NOT NULL, topup bigint NOT NULL)"


@dataclass
class Platform:
    url: str
    db: sessionmaker[Session]
    rows: dict[str, list[uuid.UUID]] = field(default_factory=dict)
    users: list[uuid.UUID] = field(default_factory=list)
    balances: dict[uuid.UUID, tuple[int, int]] = field(default_factory=dict)

    def runtime(self, tmp: Path, **settings: Any) -> Runtime:
        return Runtime(settings=Settings(database_url=self.url, **settings), sessions=self.db,
                       storage=LocalStorage(tmp / "media"))

    def cli(self, rt: Runtime, *args: str) -> Result:
        return CliRunner().invoke(main, list(args), obj=rt)

    def foreign(self) -> list[uuid.UUID]:
        return [j for name, ids in self.rows.items() for j in ids]


def _insert(conn: psycopg.Connection, user: uuid.UUID, job_type: str, status: str,
            created: datetime, started: datetime | None, credits_: int,
            meta: dict[str, int] | None) -> uuid.UUID:
    job_id = uuid.uuid4()
    conn.execute("INSERT INTO jobs (id, user_id, job_type, status, created_at, started_at) "
                 "VALUES (%s, %s, %s, %s, %s, %s)", (job_id, user, job_type, status, created, started))
    conn.execute("INSERT INTO usage_logs (id, job_id, user_id, status, credits, metadata, created_at) "
                 "VALUES (%s, %s, %s, 'reserved', %s, %s, %s)",
                 (uuid.uuid4(), job_id, user, credits_, json.dumps(meta) if meta else None, created))
    return job_id


@pytest.fixture
def platform(pg_databases: PgDatabases) -> Platform:
    url = pg_databases.create("rtadopt")
    now = datetime.now(UTC)
    p = Platform(url, make_sessionmaker(make_engine(url)))
    p.users = [uuid.uuid4() for _ in range(3)]
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(PLATFORM_DDL)
        conn.execute(BALANCES)
        for n, user in enumerate(p.users):
            p.balances[user] = (500 + 100 * n, 40 * n)
            conn.execute("INSERT INTO user_credits VALUES (%s, %s, %s)", (user, *p.balances[user]))

        def rows(name: str, count: int, job_type: str, status: str, age: timedelta,
                 started: bool = True, meta: bool = True) -> None:
            p.rows[name] = [
                _insert(conn, p.users[i % 3], job_type, status, now - age - timedelta(minutes=i),
                        now - age - timedelta(minutes=i) if started else None, 40,
                        {"from_sub": 30, "from_topup": 10} if meta else None)
                for i in range(count)]

        rows("stuck_video", 3, "video", "processing", timedelta(hours=31))
        rows("stuck_image", 3, "image", "processing", timedelta(hours=3, minutes=30), meta=False)
        rows("live_video", 3, "video", "processing", timedelta(minutes=12))
        rows("fresh_image", 3, "image", "processing", timedelta(minutes=2))
        rows("pipeline_old", 2, "pipeline", "processing", timedelta(hours=5))
        rows("pending", 3, "image", "pending", timedelta(minutes=6), started=False)
    upgrade(url)  # adoption: reconcile_meta.adopted_at = now
    with psycopg.connect(plain, autocommit=True) as conn:
        later = datetime.now(UTC) + timedelta(seconds=1)
        # after adoption: a pipeline wrapper (its started_at copied from an old parent) and a job
        p.rows["after_adoption"] = [
            _insert(conn, p.users[0], "pipeline", "processing", later, later - timedelta(hours=6), 40,
                    {"from_sub": 40, "from_topup": 0}),
            _insert(conn, p.users[1], "image", "pending", later, None, 40,
                    {"from_sub": 40, "from_topup": 0}),
        ]
    return p


def _state(db: sessionmaker[Session], ids: list[uuid.UUID]) -> dict[str, Any]:
    with db() as s:
        jobs = [tuple(r) for r in s.execute(select(*Job.__table__.columns).where(Job.id.in_(ids))
                                             .order_by(Job.id))]
        logs = [tuple(r) for r in s.execute(select(*UsageLog.__table__.columns)
                                             .order_by(UsageLog.id))]
    return {"jobs": jobs, "logs": logs}


def test_adopting_on_a_live_platform(platform: Platform, tmp_path: Path) -> None:
    p = platform
    foreign = p.foreign()
    stale = p.rows["stuck_video"] + p.rows["stuck_image"] + p.rows["pipeline_old"]

    # 1. the defaults: N ticks change no foreign row and no usage log; the line counts the
    #    legacy rows it would fail
    rt = p.runtime(tmp_path)
    before = _state(p.db, foreign)
    for _ in range(3):
        report = sweep(rt)
        assert report.observed_would_fail == len(stale) and report.failed == 0
        assert f"observed={len(stale)} would_fail={len(stale)} " in report.line(), report.line()
    assert _state(p.db, foreign) == before
    dry = p.cli(rt, "sweep", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert re.match(rf"\[reconcile\] DRY RUN scanned={len(foreign)} would_recover=0 would_fail=0 "
                    rf"would_settle=0 would_other=0 observed={len(stale)} "
                    rf"observed_would_fail={len(stale)} ", dry.stdout), dry.stdout
    assert f"observe_only fail ({len(stale)})" in dry.stdout

    # 2. the platform's balances and reservations come along: the audit is clean on day one
    preview = p.cli(rt, "credits", "import", "--dry-run", "--json")
    assert preview.exit_code == 0, preview.output
    assert json.loads(preview.stdout)["reservations"] == len(foreign)
    with p.db() as s:
        assert s.execute(select(func.count()).select_from(CreditTransaction)).scalar_one() == 0
    for _ in range(2):  # re-runnable: the second run adds nothing
        imported = p.cli(rt, "credits", "import", "--json")
        assert imported.exit_code == 0, imported.output
    summary = json.loads(imported.stdout)
    assert (summary["users"], summary["reservations"]) == (0, 0)
    assert summary["users_skipped"] == 3 and summary["reservations_skipped"] == len(foreign)
    first = json.loads(preview.stdout)
    assert {a["job_id"] for a in first["assumed"]} == {str(j) for j in p.rows["stuck_image"]}
    with p.db() as s:
        for user, (sub, topup) in p.balances.items():
            bal = s.get(CreditBalance, user)
            assert bal is not None and (bal.sub, bal.topup) == (sub, topup)
    audit = p.cli(rt, "audit")
    assert audit.exit_code == 0 and "ledger clean" in audit.stdout, audit.output

    # 3. the adoption report lists exactly what the enabled sweep then does
    with p.db() as s:
        adopted = s.execute(select(ReconcileMeta.adopted_at)).scalar_one()
    enabled = {"legacy_cutoff": adopted, "legacy_job_types": ["image", "video"]}
    report_rt = p.runtime(tmp_path, **enabled)
    shown = p.cli(report_rt, "adopt", "report", "--json")
    assert shown.exit_code == 0, shown.output
    listed = {r["job_id"] for r in json.loads(shown.stdout)["rows"]}
    expected = set(p.rows["stuck_video"] + p.rows["stuck_image"])
    assert listed == {str(j) for j in expected}
    assert json.loads(shown.stdout)["totals"] == {"fail": {"jobs": len(expected), "credits": 40 * len(expected)}}
    table = p.cli(report_rt, "adopt", "report")
    assert "total fail: 6 jobs, 240 credits" in table.stdout, table.stdout
    assert _state(p.db, foreign) == before  # the report changed nothing

    # 4. enabled with the cutoff: only stale pre-cutoff rows of allowed types, failed + refunded once
    enforcing = p.runtime(tmp_path, legacy_sweep="enforce", **enabled)
    first_tick, second_tick = sweep(enforcing), sweep(enforcing)
    assert {a.job_id for a in first_tick.actions if a.outcome == "failed"} == expected
    assert second_tick.failed == 0
    with p.db() as s:
        for job_id in foreign:
            job = s.get(Job, job_id)
            log = s.execute(select(UsageLog).where(UsageLog.job_id == job_id)).scalar_one()
            refunds = s.execute(select(func.count()).select_from(CreditTransaction).where(
                CreditTransaction.job_id == job_id, CreditTransaction.type == "REFUND")).scalar_one()
            if job_id in expected:
                assert (job.status, job.error_code, job.credits_actual) == \
                    ("failed", "RECONCILE_NO_RECOVERY", 0)
                assert log.status == "refunded" and refunds == 1
            else:
                assert job.status in ("pending", "processing") and log.status == "reserved"
                assert refunds == 0
    with p.db() as s:  # each pool got its own part back: stuck videos 30 sub + 10 topup
        balances = {u: (b.sub, b.topup) for u, b in
                    ((u, s.get(CreditBalance, u)) for u in p.users)}
    gave_back = {u: [0, 0] for u in p.users}
    for i, _ in enumerate(p.rows["stuck_video"]):
        gave_back[p.users[i % 3]][0] += 30
        gave_back[p.users[i % 3]][1] += 10
    for i, _ in enumerate(p.rows["stuck_image"]):  # no split recorded: all to sub
        gave_back[p.users[i % 3]][0] += 40
    for u in p.users:
        sub, topup = p.balances[u]
        assert balances[u] == (sub + gave_back[u][0], topup + gave_back[u][1])
    audit = p.cli(enforcing, "audit")
    assert audit.exit_code == 0, audit.output
