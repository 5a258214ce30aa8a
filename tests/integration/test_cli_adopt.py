"""`reconcile prune` (retention) and `reconcile credits import` edge cases, on PostgreSQL."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits, tasks
from reconcile.credits.importer import import_credits
from reconcile.db.models import (
    CreditBalance,
    CreditTransaction,
    Job,
    JobEvent,
    UsageLog,
    WebhookDelivery,
)
from reconcile.testing.simulator import Simulator
from tests.integration.harness import make_runtime
from tests.integration.test_cli import cli_with

NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=40)


def _job(s: Session, status: str, **columns: Any) -> uuid.UUID:
    job_id = uuid.uuid4()
    s.add(Job(id=job_id, user_id=uuid.uuid4(), job_type="image", status=status, created_at=OLD,
              **columns))
    return job_id


def _event(s: Session, job_id: uuid.UUID, created: datetime, published: bool) -> str:
    event_id = f"ev-{uuid.uuid4()}"
    s.add(JobEvent(event_id=event_id, job_id=job_id, user_id=uuid.uuid4(), type="progress",
                   created_at=created, published_at=created if published else None))
    return event_id


def _delivery(s: Session, job_id: uuid.UUID | None, received: datetime) -> str:
    delivery_id = f"d-{uuid.uuid4()}"
    s.add(WebhookDelivery(provider="replicate", delivery_id=delivery_id, upstream_id="up-1",
                          job_id=job_id, received_at=received, payload_digest="x"))
    return delivery_id


def _left(db: sessionmaker[Session]) -> tuple[set[str], set[str]]:
    with db() as s:
        return (set(s.execute(select(JobEvent.event_id)).scalars()),
                set(s.execute(select(WebhookDelivery.delivery_id)).scalars()))


@pytest.fixture
def history(db: sessionmaker[Session]) -> dict[str, str]:
    with db.begin() as s:
        done = _job(s, "completed")
        uncertain = _job(s, "pending", submission_state="uncertain", provider_kind="replicate-prediction")
        s.flush()
        return {
            "old_published": _event(s, done, OLD, True),
            "old_unpublished": _event(s, done, OLD, False),
            "recent_published": _event(s, done, NOW - timedelta(days=2), True),
            "old_done_delivery": _delivery(s, done, OLD),
            "old_unbound_delivery": _delivery(s, None, OLD),
            "old_uncertain_delivery": _delivery(s, uncertain, OLD),
            "recent_delivery": _delivery(s, done, NOW - timedelta(days=2)),
        }


def test_prune_keeps_unpublished_events_and_in_flight_evidence(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        history: dict[str, str]) -> None:
    """Past 30 days: published events and deliveries of settled (or no) jobs go; an
    unpublished event and an uncertain job's delivery stay, however old; a dry run only counts."""
    rt, _ = make_runtime(db, simulator, tmp_path)
    everything = _left(db)
    dry = cli_with(rt, "prune", "--events-days", "30", "--webhooks-days", "30", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.strip() == ("[reconcile] prune would delete job_events=1 "
                                  "webhook_deliveries=2")
    assert _left(db) == everything
    done = cli_with(rt, "prune", "--events-days", "30", "--webhooks-days", "30")
    assert done.stdout.strip() == "[reconcile] prune deleted job_events=1 webhook_deliveries=2"
    events, deliveries = _left(db)
    assert events == {history["old_unpublished"], history["recent_published"]}
    assert deliveries == {history["old_uncertain_delivery"], history["recent_delivery"]}


def test_prune_refuses_no_or_too_short_a_retention(db: sessionmaker[Session],
                                                   simulator: Simulator, tmp_path: Path) -> None:
    """Without a retention, or below a day, prune refuses (exit 2) and deletes nothing."""
    rt, _ = make_runtime(db, simulator, tmp_path)
    assert cli_with(rt, "prune").exit_code == 2
    short = cli_with(rt, "prune", "--events-days", "0.5")
    assert short.exit_code == 2 and "refused" in short.stderr
    for value in ("inf", "nan", "1e300"):  # no duration: refused as cleanly, no traceback
        odd = cli_with(rt, "prune", "--events-days", value)
        assert odd.exit_code == 2, (value, odd.stderr)
        assert "is no duration" in odd.stderr or "longer than a duration" in odd.stderr, value


def test_prune_with_a_retention_past_the_calendars_start_keeps_everything(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        history: dict[str, str]) -> None:
    """999,999 days ("keep it all", as a number): nothing is that old, nothing is deleted (the
    cutoff would be before year 1)."""
    rt, _ = make_runtime(db, simulator, tmp_path)
    before = _left(db)
    done = cli_with(rt, "prune", "--events-days", "999999", "--webhooks-days", "999999")
    assert done.exit_code == 0, done.stderr
    assert "job_events=0 webhook_deliveries=0" in done.stdout
    assert _left(db) == before


def test_the_beat_prune_task_uses_the_retention_settings(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        history: dict[str, str]) -> None:
    """reconcile.prune (the beat entry) applies JOB_EVENTS_RETENTION_DAYS only, when only it is set."""
    rt, _ = make_runtime(db, simulator, tmp_path, job_events_retention_days=30)
    tasks.set_runtime(rt)
    try:
        assert tasks.prune() == "[reconcile] prune deleted job_events=1 webhook_deliveries=0"
    finally:
        tasks.reset_runtime()
    assert history["old_published"] not in _left(db)[0]
    assert history["old_done_delivery"] in _left(db)[1]


def _platform_balances(db: sessionmaker[Session], rows: list[tuple[uuid.UUID, int, int]]) -> None:
    with db.begin() as s:
        conn = s.connection()
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS user_credits (user_id uuid PRIMARY KEY, "
                             "sub bigint NOT NULL, topup bigint NOT NULL)")
        conn.exec_driver_sql("TRUNCATE user_credits")
        for user, sub, topup in rows:
            conn.exec_driver_sql("INSERT INTO user_credits VALUES (%(u)s, %(s)s, %(t)s)",
                                 {"u": user, "s": sub, "t": topup})


def _log(s: Session, user: uuid.UUID, job_id: uuid.UUID | None, amount: int,
         meta: dict[str, Any] | None) -> uuid.UUID:
    log_id = uuid.uuid4()
    if job_id is not None and s.get(Job, job_id) is None:  # its job row (else: an orphan)
        s.add(Job(id=job_id, user_id=user, job_type="image", status="processing", created_at=OLD))
        s.flush()
    s.add(UsageLog(id=log_id, job_id=job_id, user_id=user, status="reserved", credits=amount,
                   metadata_=meta, created_at=OLD))
    return log_id


def test_credits_import_rules_and_problems(db: sessionmaker[Session]) -> None:
    """The documented rules: an exact split is kept, a missing one goes to sub, a wrong one is
    scaled; a log without a job, a negative balance and a job with two reserved logs are
    reported and skipped; what was imported audits clean."""
    alice, bob = uuid.uuid4(), uuid.uuid4()
    _platform_balances(db, [(alice, 100, 50), (bob, -5, 10)])
    jobs = {name: uuid.uuid4() for name in ("exact", "missing", "scaled", "twice")}
    with db.begin() as s:
        _log(s, alice, jobs["exact"], 40, {"from_sub": 10, "from_topup": 30})
        _log(s, alice, jobs["missing"], 20, None)
        _log(s, alice, jobs["scaled"], 30, {"from_sub": 1, "from_topup": 1})
        _log(s, alice, None, 5, {"from_sub": 5, "from_topup": 0})
        _log(s, alice, jobs["twice"], 7, None)
        _log(s, alice, jobs["twice"], 7, None)
    with db.begin() as s:
        summary = import_credits(s, now=NOW)
    assert summary.users == 1 and summary.granted == {"sub": 100, "topup": 50}
    assert any("negative balance" in p for p in summary.problems)
    assert sum("2 reserved usage logs" in p for p in summary.problems) == 2
    assert any("without a job_id" in p for p in summary.problems)
    assert sorted(a["rule"] for a in summary.assumed) == [
        "no from_sub/from_topup: all from sub", "split 1+1 != 30: scaled pro rata"]
    assert summary.reservations == 3
    with db() as s:
        usage = {t.job_id: (t.from_sub, t.from_topup) for t in s.execute(
            select(CreditTransaction).where(CreditTransaction.type == "USAGE")).scalars()}
        assert usage[jobs["exact"]] == (10, 30) and usage[jobs["missing"]] == (20, 0)
        assert usage[jobs["scaled"]] == (15, 15) and None not in usage
        bal = s.get(CreditBalance, alice)
        assert bal is not None and (bal.sub, bal.topup) == (100, 50)
        assert s.get(CreditBalance, bob) is None
        problems = [d for d in credits.audit(s, now=NOW) if d.user_id == alice]
    # what was imported balances; the skipped logs were never the ledger's, so not its to audit
    assert problems == []


def test_credits_import_dry_run_writes_nothing(db: sessionmaker[Session], simulator: Simulator,
                                               tmp_path: Path) -> None:
    """`credits import --dry-run` reports the summary and leaves the ledger empty."""
    user = uuid.uuid4()
    _platform_balances(db, [(user, 70, 0)])
    with db.begin() as s:
        _log(s, user, uuid.uuid4(), 30, {"from_sub": 30, "from_topup": 0})
    rt, _ = make_runtime(db, simulator, tmp_path)
    result = cli_with(rt, "credits", "import", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (out["users"], out["granted"], out["reservations"]) == (1, {"sub": 70, "topup": 0}, 1)
    with db() as s:
        assert s.execute(select(func.count()).select_from(CreditTransaction)).scalar_one() == 0


def test_stuck_kind_takes_the_observe_only_names(db: sessionmaker[Session]) -> None:
    """`stuck --kind` spells kinds as OBSERVE_ONLY_KINDS does: 'legacy', '*', a kind; anything
    else is refused (exit 2) instead of listing nothing."""
    from tests.integration.test_cli import add_job, cli, ids

    legacy = add_job(db, kind=None, submission=None, task_id=None, age=timedelta(minutes=10))
    standard = add_job(db, age=timedelta(minutes=11))
    assert ids(cli(db, "stuck", "--kind", "legacy", "--json")) == {str(legacy)}
    assert ids(cli(db, "stuck", "--kind", "*", "--json")) == {str(legacy), str(standard)}
    wrong = cli(db, "stuck", "--kind", "legacy-rows")
    assert wrong.exit_code == 2 and "unknown kind" in wrong.stderr


def test_worker_and_beat_refuse_an_unknown_observe_only_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker_init / beat_init check stops the process on a name that protects nothing
    (SystemExit: Celery would log and swallow a plain exception from a signal receiver)."""
    from reconcile.celery_install import check_settings as _check_settings

    monkeypatch.setenv("RECONCILE_OBSERVE_ONLY_KINDS", '["legacy", "kie-standrad"]')
    with pytest.raises(SystemExit, match="kie-standrad"):
        _check_settings()
    monkeypatch.setenv("RECONCILE_OBSERVE_ONLY_KINDS", '["legacy", "kie-standard", "*"]')
    _check_settings()


def test_the_prune_beat_entry_exists_only_with_a_retention(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packaged Celery settings (and so install(app)) schedule reconcile.prune only when a
    retention is set."""
    import importlib

    from celery import Celery

    from reconcile import celery_install, celery_settings

    try:
        monkeypatch.setenv("RECONCILE_WEBHOOK_DELIVERIES_RETENTION_DAYS", "30")
        importlib.reload(celery_settings)
        assert celery_settings.beat_schedule["reconcile-prune"]["task"] == "reconcile.prune"
        app = Celery("platform", set_as_current=False)
        celery_install.install(app)
        assert "reconcile-prune" in app.conf.beat_schedule
        monkeypatch.delenv("RECONCILE_WEBHOOK_DELIVERIES_RETENTION_DAYS")
        importlib.reload(celery_settings)
        assert "reconcile-prune" not in celery_settings.beat_schedule
    finally:
        monkeypatch.delenv("RECONCILE_WEBHOOK_DELIVERIES_RETENTION_DAYS", raising=False)
        importlib.reload(celery_settings)
        from reconcile import celery_app

        celery_install.install(celery_app.app)  # the library's own app stays the installed one
