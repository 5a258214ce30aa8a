"""Issue 24 acceptance: the settlement policy set ONLY in the environment (failures refund 1/2, a
user's cancel 1/3) reaches every process that settles — a real ``celery worker``, the example
platform's gateway over HTTP, ``reconcile sweep``, ``reconcile fail``, ``reconcile resolve
--not-submitted`` and the Celery ``settle`` task — for jobs the provider accepted and jobs it never
accepted. Each job's credits kept is read from the documented path × cause × credits-kept table
(README, The share of a failed or cancelled job; parsed as ``tests/unit/test_settlement_table.py``
parses it, not recomputed by the library's rule), and ``reconcile audit`` is clean at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits, lifecycle, tasks
from reconcile.settlement import kept_of
from reconcile.testing.simulator import Script, Simulator
from tests.integration.harness import make_runtime
from tests.integration.test_cli import add_job, cli, load, url_of
from tests.integration.test_worker_crash import TIME_SCALE, _env, _purge
from tests.integration.workers import Worker, make_sender, wait_for
from tests.unit.test_settlement_table import _share_of, _table

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "platform"
ACCEPTED, NOT_ACCEPTED = "async, task id", "async, no task id"  # the table's async columns
GATEWAY_PRICE = 10  # acme's price of a kie-standard job (examples/platform/acme/settings.py)


def table_kept(cause: str, column: str, held: int) -> int:
    """The credits kept of ``held`` for a job of ``cause`` on the table's ``column``, by the
    documented table's cell (``keeps F`` / ``keeps C`` / ``0`` under F = 1/2, C = 1/3)."""
    columns, rows = _table()
    return kept_of(held, _share_of(rows[cause][columns.index(column)]))


@pytest.fixture
def policy_env(db: sessionmaker[Session], tmp_path: Path, redis_url: str,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The deployment's environment: the policy, the database, the storage, the broker."""
    monkeypatch.setenv("RECONCILE_FAILURE_REFUND", "1/2")
    monkeypatch.setenv("RECONCILE_CANCEL_REFUND", "1/3")
    monkeypatch.setenv("RECONCILE_DATABASE_URL", url_of(db))
    monkeypatch.setenv("RECONCILE_STORAGE_URL", f"file://{tmp_path / 'media'}")
    monkeypatch.setenv("RECONCILE_BROKER_URL", redis_url)
    _purge(redis_url)
    tasks.reset_runtime()
    yield
    tasks.reset_runtime()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    """The example platform's FastAPI gateway under uvicorn, its environment this process's
    (the policy included) plus the simulator's."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.port = _free_port()
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "acme.gateway:app", "--host", "127.0.0.1",
                 "--port", str(self.port)], cwd=EXAMPLE, env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    def healthy(self) -> bool:
        try:
            return self.http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def submit(self, user: uuid.UUID, model: str) -> httpx.Response:
        return self.http.post("/api/v1/jobs", headers={"X-User-Id": str(user)},
                              json={"provider_kind": "kie-standard", "model": model,
                                    "input": {"prompt": "a lighthouse"}})

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def test_every_process_settles_by_the_environments_policy_and_the_readme_table(
        db: sessionmaker[Session], pg_url: str, simulator: Simulator, tmp_path: Path,
        redis_url: str, policy_env: None) -> None:
    user = uuid.uuid4()
    with db.begin() as s:
        credits.grant(s, user, "sub", 10_000, f"grant-{user}")
    # (path, job id, cause, table column, credits held)
    cases: list[tuple[str, uuid.UUID, str, str, int]] = []

    # the processes: a library worker, and the example gateway (inline creates; its first poll
    # goes to the same broker, which the worker serves)
    worker = Worker(_env(pg_url, redis_url, simulator, tmp_path), tmp_path / "worker.log",
                    concurrency=2)
    gateway = Gateway({**os.environ, **simulator.env(), "RECONCILE_TIME_SCALE": str(TIME_SCALE),
                       # the example's model allow-list (acme/catalog.py), opened to the
                       # simulator's scripted models as test_example_platform does
                       "ACME_MODELS": "kie-standard=slow,kie-standard=refused",
                       "NO_PROXY": "127.0.0.1,localhost"}, tmp_path / "gateway.log")
    try:
        worker.wait_ready()
        assert wait_for(gateway.healthy, 60), gateway.log_path.read_text()[-3000:]

        # --- the worker: an accepted job the provider fails, a create the provider rejects
        sender = make_sender(redis_url)
        rt, _ = make_runtime(db, simulator, tmp_path, time_scale=TIME_SCALE)
        rt.enqueue_create = lambda jid, countdown=0.0: sender.send_task(
            "reconcile.create", args=[str(jid)], countdown=countdown or None)
        scripts = {
            ("upstream_failure", ACCEPTED): Script(timeline=((0.0, "queued"), (0.2, "running"),
                                                             (0.6, "failed"))),
            ("rejected_create", NOT_ACCEPTED): Script(create="reject_invalid"),
        }
        worker_jobs = []
        for (cause, column), script in scripts.items():
            job_id = uuid.uuid4()
            simulator.script(str(job_id), script)
            lifecycle.submit_job(rt, user, "kie-standard", "m", {"prompt": "x"}, 40,
                                 job_type="image", job_id=job_id)
            cases.append(("worker", job_id, cause, column, 40))
            worker_jobs.append(job_id)

        # --- the gateway: a cancel of an accepted job; a create the provider refuses
        simulator.script_model("slow", Script(timeline=((0.0, "queued"), (0.2, "running"),
                                                        (600.0, "succeeded"))))
        simulator.script_model("refused", Script(create="reject_invalid"))
        slow = gateway.submit(user, "slow")
        assert slow.status_code == 202, slow.text
        slow_id = slow.json()["job_id"]
        cancelled = gateway.http.post(f"/api/v1/jobs/{slow_id}/cancel",
                                      headers={"X-User-Id": str(user)})
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "canceled", \
            cancelled.text
        cases.append(("gateway", uuid.UUID(slow_id), "user_cancel", ACCEPTED, GATEWAY_PRICE))
        refused = gateway.submit(user, "refused")
        assert refused.status_code == 502, refused.text
        refused_id = uuid.UUID(refused.json()["error"]["job_id"])
        cases.append(("gateway", refused_id, "rejected_create", NOT_ACCEPTED, GATEWAY_PRICE))

        def settled() -> bool:
            return all(load(db, j).credits_actual is not None
                       for j in (*worker_jobs, uuid.UUID(slow_id), refused_id))

        assert wait_for(settled, 40), worker.log_path.read_text()[-3000:]
    finally:
        gateway.stop()
        worker.stop()

    # --- `reconcile sweep`: settlements interrupted after the terminal write (retry due)
    ago = datetime.now(UTC) - timedelta(hours=1)
    due = {"completed_at": ago, "next_poll_at": ago}
    swept = [
        (add_job(db, user=user, reserve=40, status="failed", error_code="UPSTREAM_FAILED", **due),
         "upstream_failure", ACCEPTED),
        (add_job(db, user=user, reserve=40, status="cancelled", error_code="CANCELED", **due),
         "user_cancel", ACCEPTED),
        (add_job(db, user=user, reserve=40, status="failed", error_code="UPSTREAM_FAILED",
                 task_id=None, submission="submitting", **due), "upstream_failure", NOT_ACCEPTED),
    ]
    result = cli(db, "sweep")
    assert result.exit_code == 0, result.output
    cases += [("sweep", job_id, cause, column, 40) for job_id, cause, column in swept]

    # --- `reconcile fail`: an operator fails an accepted job and one never submitted
    failed = [(add_job(db, user=user, reserve=40), ACCEPTED),
              (add_job(db, user=user, reserve=40, status="pending", submission="not_started",
                       task_id=None), NOT_ACCEPTED)]
    for job_id, column in failed:
        result = cli(db, "fail", str(job_id), "--reason", "stuck")
        assert result.exit_code == 0, result.output
        cases.append(("fail", job_id, "operator_fail", column, 40))

    # --- `reconcile resolve --not-submitted`: by definition never accepted upstream
    unsure = add_job(db, user=user, reserve=40, status="pending", submission="uncertain",
                     task_id=None)
    result = cli(db, "resolve", str(unsure), "--not-submitted")
    assert result.exit_code == 0, result.output
    cases.append(("resolve --not-submitted", unsure, "not_submitted", NOT_ACCEPTED, 40))

    # --- the Celery settle task, its runtime built from Settings() of this environment
    owed = [
        (add_job(db, user=user, reserve=40, status="failed", error_code="UPSTREAM_FAILED", **due),
         "upstream_failure", ACCEPTED),
        (add_job(db, user=user, reserve=40, status="cancelled", error_code="CANCELED", **due),
         "user_cancel", ACCEPTED),
        (add_job(db, user=user, reserve=40, status="failed", error_code="UPSTREAM_FAILED",
                 task_id=None, submission="submitting", **due), "upstream_failure", NOT_ACCEPTED),
    ]
    for job_id, cause, column in owed:
        assert tasks.settle(str(job_id)) == "settled"
        cases.append(("settle task", job_id, cause, column, 40))

    kept = {(path, cause, column): (load(db, job_id).credits_actual,
                                    table_kept(cause, column, held))
            for path, job_id, cause, column, held in cases}
    assert {key: got for key, (got, _) in kept.items()} == \
        {key: expected for key, (_, expected) in kept.items()}
    # both kinds of outcome happened on every path that can have both
    for path in ("worker", "gateway", "sweep", "fail", "settle task"):
        assert {got > 0 for (p, _, _), (got, _) in kept.items() if p == path} == {True, False}, path
    audit = cli(db, "audit")
    assert audit.exit_code == 0 and "ledger clean" in audit.stdout, audit.output
