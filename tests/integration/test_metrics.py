"""Prometheus metrics read from real PostgreSQL at scrape time."""

from __future__ import annotations

import socket
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

from click.testing import CliRunner
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, Settings
from reconcile.cli import main
from reconcile.db.models import CreditAnomaly
from reconcile.db.session import make_engine, make_sessionmaker
from reconcile.ops.metrics import collect, serve
from reconcile.storage import LocalStorage
from tests.integration.test_cli import add_job, url_of

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def runtime(db: sessionmaker[Session], tmp_path: Path) -> Runtime:
    return Runtime(settings=Settings(database_url=url_of(db)), sessions=db,
                   storage=LocalStorage(tmp_path))


def samples(text: str) -> Samples:
    """Every sample of an exposition, keyed by name and sorted labels."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(rt: Runtime) -> Samples:
    return samples(generate_latest(collect(rt)).decode())


def test_metrics_count_in_flight_jobs_by_kind_and_unsettled_refunds(db: sessionmaker[Session],
                                                                    tmp_path: Path) -> None:
    """Gauges match the table: in flight by kind, oldest age, uncertain, unsettled, outcomes."""
    now = datetime.now(UTC)
    add_job(db, age=timedelta(minutes=30))
    add_job(db, age=timedelta(minutes=5))
    add_job(db, kind="fal-queue", status="pending", submission="uncertain", task_id=None,
            age=timedelta(minutes=3))
    add_job(db, kind=None, submission=None, task_id=None, age=timedelta(minutes=8))
    add_job(db, status="completed", reserve=0)
    failed = add_job(db, status="failed", error_code="UPSTREAM_FAILED", next_poll_at=now)
    add_job(db, status="failed", error_code="UPSTREAM_FAILED", next_poll_at=now)
    add_job(db, status="failed", error_code="UPSTREAM_TIMEOUT", credits_actual=0)
    with db.begin() as s:
        s.add(CreditAnomaly(job_id=failed, kind="uncertain_unresolved", created_at=now))

    got = scrape(runtime(db, tmp_path))

    assert got[("reconcile_up", ())] == 1
    inflight = {k[1]: v for k, v in got.items() if k[0] == "reconcile_inflight_jobs"}
    assert inflight == {
        (("kind", "kie-standard"), ("status", "processing")): 2,
        (("kind", "fal-queue"), ("status", "pending")): 1,
        (("kind", "legacy"), ("status", "processing")): 1,
    }
    oldest = got[("reconcile_inflight_oldest_age_seconds", (("kind", "kie-standard"),))]
    assert 30 * 60 <= oldest < 31 * 60
    assert got[("reconcile_uncertain_submissions", (("kind", "fal-queue"),))] == 1
    assert got[("reconcile_unsettled_refunds", ())] == 2
    assert got[("reconcile_job_outcomes", (("error_code", "UPSTREAM_FAILED"), ("status", "failed")))] == 2
    assert got[("reconcile_job_outcomes", (("error_code", ""), ("status", "completed")))] == 1
    assert got[("reconcile_credit_anomalies", (("kind", "uncertain_unresolved"),))] == 1


def test_an_empty_database_exposes_zero_unsettled_and_no_in_flight(db: sessionmaker[Session],
                                                                    tmp_path: Path) -> None:
    """With no jobs the scrape still succeeds: unsettled is 0 and no in-flight series exist."""
    got = scrape(runtime(db, tmp_path))
    assert got[("reconcile_up", ())] == 1
    assert got[("reconcile_unsettled_refunds", ())] == 0
    assert not [k for k in got if k[0] == "reconcile_inflight_jobs"]


def test_an_unreachable_database_reports_down_instead_of_failing(tmp_path: Path) -> None:
    """A scrape whose database is gone answers reconcile_up 0 rather than an error."""
    engine = make_engine("postgresql+psycopg://postgres@127.0.0.1:5432/no_such_db_metrics")
    rt = Runtime(settings=Settings(), sessions=make_sessionmaker(engine),
                 storage=LocalStorage(tmp_path))
    got = scrape(rt)
    engine.dispose()
    assert got[("reconcile_up", ())] == 0
    assert ("reconcile_unsettled_refunds", ()) not in got


def test_serve_answers_scrapes_over_http(db: sessionmaker[Session], tmp_path: Path) -> None:
    """`serve` exposes the same collector on /metrics."""
    add_job(db)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server, thread = serve(runtime(db, tmp_path), port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            got = samples(resp.read().decode())
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert got[("reconcile_inflight_jobs", (("kind", "kie-standard"), ("status", "processing")))] == 1


def test_cli_metrics_once_prints_one_scrape(db: sessionmaker[Session]) -> None:
    """`reconcile metrics --once` prints the exposition for the given database."""
    add_job(db, status="failed", next_poll_at=datetime.now(UTC))
    result = CliRunner().invoke(main, ["--database-url", url_of(db), "metrics", "--once"])
    assert result.exit_code == 0, result.output
    assert samples(result.stdout)[("reconcile_unsettled_refunds", ())] == 1
