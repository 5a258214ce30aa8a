"""The `reconcile` operator command against real PostgreSQL (click's CliRunner, one subprocess)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, Settings, credits
from reconcile.cli import main
from reconcile.db.models import CreditBalance, CreditTransaction, Job, WebhookDelivery
from reconcile.testing.simulator import Simulator
from tests.integration.harness import make_runtime

ROOT = Path(__file__).resolve().parents[2]
TICK = re.compile(r"^\[reconcile\] scanned=\d+ recovered=\d+ failed=\d+ stillRunning=\d+ "
                  r"errors=\d+ \(\d+ms\)$")
DRY_TICK = re.compile(r"^\[reconcile\] DRY RUN scanned=\d+ would_recover=\d+ would_fail=\d+ "
                      r"would_settle=\d+ would_other=\d+ observed=\d+ observed_would_fail=\d+ "
                      r"errors=\d+ \(\d+ms\)$")


def url_of(db: sessionmaker[Session]) -> str:
    return db.kw["bind"].url.render_as_string(hide_password=False)


def add_job(db: sessionmaker[Session], *, status: str = "processing",
            submission: str | None = "accepted", kind: str | None = "kie-standard",
            age: timedelta = timedelta(minutes=30), task_id: str | None = "task-1",
            reserve: int = 40, user: uuid.UUID | None = None, **columns: Any) -> uuid.UUID:
    """A job started ``age`` ago whose user was granted 1000 credits and holds ``reserve``."""
    job_id, user = uuid.uuid4(), user or uuid.uuid4()
    started = datetime.now(UTC) - age
    with db.begin() as s:
        credits.grant(s, user, "sub", 1000, f"grant-{job_id}", now=started)
        s.add(Job(id=job_id, user_id=user, job_type="image", status=status, created_at=started,
                  started_at=started, provider_kind=kind, provider_task_id=task_id,
                  provider_call_started_at=started if kind else None,
                  submission_state=submission, **columns))
        s.flush()
        if reserve:
            credits.reserve(s, user, job_id, reserve, now=started)
    return job_id


def load(db: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def balance(db: sessionmaker[Session], job_id: uuid.UUID) -> int:
    with db() as s:
        row = s.get(CreditBalance, load(db, job_id).user_id)
        return 0 if row is None else row.sub + row.topup


def refunds(db: sessionmaker[Session], job_id: uuid.UUID) -> list[int]:
    with db() as s:
        return list(s.execute(select(CreditTransaction.amount).where(
            CreditTransaction.job_id == job_id, CreditTransaction.type == "REFUND")).scalars())


def cli(db: sessionmaker[Session], *args: str) -> Result:
    """Run the command the way an operator does: a database URL, a runtime built from settings."""
    return CliRunner().invoke(main, ["--database-url", url_of(db), *args])


def cli_with(rt: Runtime, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=rt)


def ids(result: Result) -> set[str]:
    assert result.exit_code == 0, result.output
    return {row["id"] for row in json.loads(result.stdout)}


# ----------------------------------------------------------------------------- listings


def test_stuck_lists_in_flight_jobs_past_their_kind_threshold(db: sessionmaker[Session]) -> None:
    """Only in-flight rows past their own kind's threshold (or legacy rows past 5 min) are stuck."""
    late = add_job(db, reconcile_attempts=3, reconcile_last_error="running")
    legacy = add_job(db, kind=None, submission=None, task_id=None, age=timedelta(minutes=10))
    add_job(db, kind="kie-lip-sync", age=timedelta(minutes=30))  # threshold 75 min
    add_job(db, age=timedelta(minutes=2))  # kie-standard, threshold 10 min
    add_job(db, status="completed", age=timedelta(hours=2))

    assert ids(cli(db, "stuck", "--json")) == {str(late), str(legacy)}
    table = cli(db, "stuck")
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["ID", "KIND", "STATUS", "SUBMISSION", "AGE", "ATTEMPTS",
                                "LAST_ERROR"]
    assert len(lines) == 3
    row = next(line for line in lines if str(late) in line).split()
    assert row[1:4] == ["kie-standard", "processing", "accepted"] and row[5:] == ["3", "running"]
    assert str(legacy) in table.stdout


def test_stuck_filters_by_kind_and_explicit_age(db: sessionmaker[Session]) -> None:
    """--kind narrows to one provider kind ('legacy' for none); --older-than replaces thresholds."""
    standard = add_job(db)
    lip = add_job(db, kind="kie-lip-sync", age=timedelta(minutes=30))
    legacy = add_job(db, kind=None, submission=None, task_id=None, age=timedelta(minutes=10))

    assert ids(cli(db, "stuck", "--kind", "kie-standard", "--json")) == {str(standard)}
    assert ids(cli(db, "stuck", "--kind", "legacy", "--json")) == {str(legacy)}
    assert ids(cli(db, "stuck", "--older-than", "20", "--json")) == {str(standard), str(lip)}
    assert cli(db, "stuck", "--kind", "fal-queue").stdout.strip() == "no stuck jobs"


def test_uncertain_lists_unknown_outcomes_with_their_reservation(db: sessionmaker[Session]) -> None:
    """Uncertain and expired-claim submitting jobs are listed with the credits they still hold."""
    now = datetime.now(UTC)
    unsure = add_job(db, status="pending", submission="uncertain", task_id=None, reserve=40)
    expired = add_job(db, status="pending", submission="submitting", task_id=None, reserve=25,
                      claim_token="t", claim_expires_at=now - timedelta(minutes=1))
    add_job(db, status="pending", submission="submitting", task_id=None,
            claim_token="t", claim_expires_at=now + timedelta(minutes=1))
    add_job(db)  # accepted

    result = cli(db, "uncertain", "--json")
    assert ids(result) == {str(unsure), str(expired)}
    rows = {r["id"]: r for r in json.loads(result.stdout)}
    assert rows[str(unsure)]["reserved"] == 40 and rows[str(expired)]["reserved"] == 25
    assert rows[str(expired)]["submission"] == "submitting"
    table = cli(db, "uncertain").stdout
    assert str(unsure) in table and str(expired) in table and "RESERVED" in table


def test_unsettled_lists_failed_jobs_whose_refund_is_pending(db: sessionmaker[Session]) -> None:
    """A failed job with credits_actual NULL and a settlement time is listed; settled or platform
    rows are not."""
    now = datetime.now(UTC)
    pending = add_job(db, status="failed", error_code="UPSTREAM_FAILED", next_poll_at=now,
                      settle_attempts=2)
    add_job(db, status="failed", credits_actual=0)
    add_job(db, status="failed", submission=None, kind=None, task_id=None)  # a platform's old row
    add_job(db, status="processing", next_poll_at=now)

    result = cli(db, "unsettled", "--json")
    assert ids(result) == {str(pending)}
    row = json.loads(result.stdout)[0]
    assert row["settle_attempts"] == 2 and row["error_code"] == "UPSTREAM_FAILED"
    assert row["reserved"] == 40 and row["next_poll_at"]
    assert str(pending) in cli(db, "unsettled").stdout


def test_show_prints_the_job_and_its_ledger_rows(db: sessionmaker[Session]) -> None:
    """`show` after a fail includes the usage log, the usage and refund transactions."""
    job_id = add_job(db)
    assert cli(db, "fail", str(job_id)).exit_code == 0

    result = cli(db, "show", str(job_id), "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["job"]["id"] == str(job_id) and out["job"]["status"] == "failed"
    assert out["job"]["credits_actual"] == 0
    assert [u["status"] for u in out["usage_logs"]] == ["refunded"]
    assert {t["id"] for t in out["transactions"]} == {f"job-usage:{job_id}", f"job-refund:{job_id}"}
    table = cli(db, "show", str(job_id)).stdout
    assert f"job-refund:{job_id}" in table and "RECONCILE_NO_RECOVERY" in table
    assert "transactions (2)" in table


def test_show_an_uncertain_fal_job_with_a_stored_delivery(db: sessionmaker[Session]) -> None:
    """Issue 24 finding 15: `show` judges a stored delivery with the settings (it passed the
    settings method itself and crashed with AttributeError on fal's signed-job-id check)."""
    job_id = add_job(db, kind="fal-queue", submission="uncertain", task_id=None)
    with db.begin() as s:
        s.add(WebhookDelivery(provider="fal", delivery_id=f"d-{job_id}", job_id=job_id,
                              upstream_id="req-1", received_at=datetime.now(UTC),
                              payload_digest="x", status="OK", payload={"request_id": "req-1"}))

    result = cli(db, "show", str(job_id), "--json")
    assert result.exit_code == 0, result.output
    deliveries = json.loads(result.stdout)["webhook_deliveries"]
    assert [d["delivery_id"] for d in deliveries] == [f"d-{job_id}"]
    assert deliveries[0]["evidence"].startswith(("operator only:", "adoptable"))
    table = cli(db, "show", str(job_id))
    assert table.exit_code == 0 and "webhook deliveries (1)" in table.stdout


# ----------------------------------------------------------------------------- changes


def test_fail_refunds_exactly_once(db: sessionmaker[Session]) -> None:
    """`fail` fails and refunds; a second `fail` changes nothing and says so."""
    job_id = add_job(db)
    assert balance(db, job_id) == 960

    first = cli(db, "fail", str(job_id), "--reason", "provider lost it")
    assert first.exit_code == 0, first.output
    assert "refunded 40 credits" in first.stdout
    job = load(db, job_id)
    assert (job.status, job.error_code, job.error_message) == (
        "failed", "RECONCILE_NO_RECOVERY", "reconcile_no_recovery")
    assert job.error_detail == {"by": "operator", "reason": "provider lost it"}
    assert job.credits_actual == 0 and job.next_poll_at is None
    assert balance(db, job_id) == 1000 and refunds(db, job_id) == [40]

    second = cli(db, "fail", str(job_id))
    assert second.exit_code == 0
    assert "already failed" in second.stderr and "nothing done" in second.stderr
    assert balance(db, job_id) == 1000 and refunds(db, job_id) == [40]
    assert cli(db, "audit").exit_code == 0


def test_fail_refuses_an_uncertain_job(db: sessionmaker[Session]) -> None:
    """An uncertain job is not failed (it may exist upstream): exit 2, pointing to `resolve`."""
    job_id = add_job(db, status="pending", submission="uncertain", task_id=None)

    result = cli(db, "fail", str(job_id))
    assert result.exit_code == 2
    assert "uncertain" in result.stderr and "reconcile resolve" in result.stderr
    job = load(db, job_id)
    assert (job.status, job.submission_state) == ("pending", "uncertain")
    assert balance(db, job_id) == 960 and refunds(db, job_id) == []


def test_fail_refuses_a_completed_job(db: sessionmaker[Session]) -> None:
    """A completed job keeps its committed credits: exit 2."""
    job_id = add_job(db, status="completed", reserve=0)
    result = cli(db, "fail", str(job_id))
    assert result.exit_code == 2 and "completed" in result.stderr
    assert load(db, job_id).status == "completed"


def test_resolve_upstream_id_adopts_and_resumes_polling(db: sessionmaker[Session],
                                                        simulator: Simulator, tmp_path: Path) -> None:
    """--upstream-id makes the uncertain job processing with that task id and enqueues a poll."""
    rt, queues = make_runtime(db, simulator, tmp_path)
    job_id = add_job(db, status="pending", submission="uncertain", task_id=None,
                     reconcile_attempts=7)

    result = cli_with(rt, "resolve", str(job_id), "--upstream-id", "task-from-dashboard")
    assert result.exit_code == 0, result.output
    job = load(db, job_id)
    assert (job.status, job.submission_state, job.provider_task_id) == (
        "processing", "accepted", "task-from-dashboard")
    assert job.reconcile_attempts == 0 and job.error_detail == {"adopted_from": "operator"}
    assert [p[0] for p in queues.polls] == [job_id]
    assert balance(db, job_id) == 960  # still reserved: the result decides


def test_resolve_not_submitted_fails_and_refunds(db: sessionmaker[Session]) -> None:
    """--not-submitted fails the job as rejected and returns its credits once."""
    job_id = add_job(db, status="pending", submission="uncertain", task_id=None)

    result = cli(db, "resolve", str(job_id), "--not-submitted")
    assert result.exit_code == 0, result.output
    assert "refunded 40 credits" in result.stdout
    job = load(db, job_id)
    assert (job.status, job.submission_state, job.error_code) == (
        "failed", "rejected", "RECONCILE_NO_RECOVERY")
    assert job.credits_actual == 0 and balance(db, job_id) == 1000 and refunds(db, job_id) == [40]

    again = cli(db, "resolve", str(job_id), "--not-submitted")
    assert again.exit_code == 2 and refunds(db, job_id) == [40]


def test_resolve_refuses_a_live_claim_and_needs_exactly_one_option(db: sessionmaker[Session]) -> None:
    """A submission a worker still holds is not resolved; both or neither option is a usage error."""
    live = add_job(db, status="pending", submission="submitting", task_id=None, claim_token="t",
                   claim_expires_at=datetime.now(UTC) + timedelta(minutes=1))
    result = cli(db, "resolve", str(live), "--not-submitted")
    assert result.exit_code == 2 and "holds the submission claim" in result.stderr
    assert load(db, live).status == "pending"

    assert cli(db, "resolve", str(live)).exit_code == 2
    both = cli(db, "resolve", str(live), "--upstream-id", "x", "--not-submitted")
    assert both.exit_code == 2 and "exactly one" in both.stderr


# ----------------------------------------------------------------------------- audit, sweep, errors


def test_audit_exits_zero_when_clean_and_one_on_a_corrupted_balance(db: sessionmaker[Session]) -> None:
    """The audit's exit code tells a script whether the ledger balances."""
    job_id = add_job(db)
    clean = cli(db, "audit")
    assert clean.exit_code == 0 and "ledger clean" in clean.stdout

    with db.begin() as s:
        s.execute(text("UPDATE reconcile_credit_balances SET sub = sub + 5 WHERE user_id = :u"),
                  {"u": load(db, job_id).user_id})
    broken = cli(db, "audit", "--json")
    assert broken.exit_code == 1
    kinds = {d["kind"] for d in json.loads(broken.stdout)}
    assert "balance_mismatch" in kinds
    assert "balance_mismatch" in cli(db, "audit").stdout


def test_audit_grace_decides_when_a_terminal_reservation_counts(db: sessionmaker[Session]) -> None:
    """A failed job still holding its reservation is reported only past --grace-minutes."""
    add_job(db, status="failed", age=timedelta(minutes=30), completed_at=datetime.now(UTC)
            - timedelta(minutes=30))
    assert cli(db, "audit", "--grace-minutes", "60").exit_code == 0
    late = cli(db, "audit", "--grace-minutes", "10", "--json")
    assert late.exit_code == 1
    assert [d["kind"] for d in json.loads(late.stdout)] == ["terminal_job_reserved"]


def test_sweep_dry_run_prints_the_tick_line_and_changes_nothing(db: sessionmaker[Session]) -> None:
    """`sweep --dry-run` prints exactly one tick line and leaves a stale legacy row alone."""
    legacy = add_job(db, kind=None, submission=None, task_id=None, age=timedelta(minutes=30))

    result = cli(db, "sweep", "--dry-run")
    assert result.exit_code == 0, result.output
    assert DRY_TICK.match(result.stdout.splitlines()[0]), result.stdout
    assert "scanned=1 " in result.stdout
    assert load(db, legacy).status == "processing" and balance(db, legacy) == 960


def test_bad_or_unknown_job_ids_exit_2_with_a_message(db: sessionmaker[Session]) -> None:
    """A malformed id or an unknown job is an operator error (exit 2), never a traceback."""
    bad = cli(db, "show", "not-a-uuid")
    assert bad.exit_code == 2 and "not a job id" in bad.stderr
    for command in ("show", "fail"):
        unknown = cli(db, command, str(uuid.uuid4()))
        assert unknown.exit_code == 2 and "no job" in unknown.stderr
        assert "Traceback" not in unknown.output


def test_unreachable_database_is_one_clear_line() -> None:
    """A database that does not exist gives exit 1 and a message, not a traceback."""
    result = CliRunner().invoke(main, ["--database-url",
                                       "postgresql://postgres@127.0.0.1:5432/no_such_db_x", "stuck"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-1].startswith("Error: database error:")
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_settings_that_do_not_load_are_one_clear_message(db: sessionmaker[Session],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad variable (infinite, zero where zero means nothing) stops the command with exit 1 and
    each variable named, not a traceback through pydantic; the value itself is not echoed."""
    monkeypatch.setenv("RECONCILE_READ_TIMEOUT", "inf")
    monkeypatch.setenv("RECONCILE_TIME_SCALE", "0")
    result = cli(db, "sweep", "--dry-run")
    assert result.exit_code == 1, result.output
    last = result.stderr.splitlines()[-1]
    assert last.startswith("Error: the settings do not load: "), result.stderr
    assert "RECONCILE_READ_TIMEOUT: Input should be a finite number" in last
    assert "RECONCILE_TIME_SCALE: Input should be greater than or equal to 0.0001" in last
    assert "Traceback" not in result.output and "inf" not in last.split("finite")[1]
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_start_up_check_that_refuses_is_one_clear_message(db: sessionmaker[Session],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings that load but a start-up check refuses (a sync call's deadline that its connect
    timeout does not fit, a required kind not registered): exit 1 and the check's message."""
    for env, value, said in (("RECONCILE_CONNECT_TIMEOUT", "1000", "RECONCILE_SYNC_DEADLINE="),
                             ("RECONCILE_REQUIRED_KINDS", '["no-such-kind"]', "REQUIRED_KINDS")):
        with monkeypatch.context() as patched:
            patched.setenv(env, value)
            result = cli(db, "sweep", "--dry-run")
        assert result.exit_code == 1, result.output
        assert result.stderr.splitlines()[-1].startswith(f"Error: {said}"), result.stderr
        assert "Traceback" not in result.output


def test_a_given_runtime_whose_sessions_pick_their_own_bind_runs_the_command(
        db: sessionmaker[Session]) -> None:
    """``main(args, obj=runtime)`` with a platform's routing Session class (no ``bind=`` on the
    sessionmaker) or a sessionmaker bound to a connection: the command says which database it
    uses and runs (it read ``sessionmaker.kw["bind"].url``: an AttributeError)."""
    engine = db.kw["bind"]
    job_id = add_job(db, status="failed", next_poll_at=datetime.now(UTC))

    class Routing(Session):
        def get_bind(self, mapper: Any = None, **kw: Any) -> Any:
            return engine

    with engine.connect() as conn:
        for sessions in (sessionmaker(class_=Routing), sessionmaker(bind=conn)):
            rt = Runtime(settings=Settings(database_url=url_of(db)), sessions=sessions,
                         storage=None)  # type: ignore[arg-type]
            result = cli_with(rt, "unsettled", "--json")
            assert result.exit_code == 0, result.output
            assert f"database: {engine.url.render_as_string()}" in result.stderr
            assert str(job_id) in {row["id"] for row in json.loads(result.stdout)}


def test_python_dash_m_reconcile_runs_the_command(db: sessionmaker[Session]) -> None:
    """`python -m reconcile` is the same command (the console script's twin)."""
    job_id = add_job(db, status="failed", next_poll_at=datetime.now(UTC))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "reconcile", "--database-url", url_of(db), "unsettled", "--json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [row["id"] for row in json.loads(proc.stdout)] == [str(job_id)]


def test_audit_grace_past_the_minutes_bound_is_a_usage_error_not_a_traceback(
        db: sessionmaker[Session]) -> None:
    """`--grace-minutes 99999999999` overflowed the timedelta (a traceback); it is bounded as
    the console's minutes parameters are (the one bound, ops.queries.MAX_MINUTES)."""
    from reconcile.ops.queries import MAX_MINUTES

    said = cli(db, "audit", "--grace-minutes", "99999999999")
    assert said.exit_code == 2 and "--grace-minutes" in said.output
    assert "Traceback" not in said.output
    assert cli(db, "audit", "--grace-minutes", str(MAX_MINUTES)).exit_code == 0
