"""The example Django platform (``examples/django_platform``), run for real on PostgreSQL.

``manage.py migrate`` creates the platform's ``jobs``/``usage_logs`` (its own models, Django's
BigAutoField on ``usage_logs``) and then runs the library's migrations (``reconcile.contrib.
django``); ``manage.py reconcile db check`` finds the tables fit the contract; a Celery worker
started from the Django project (``celery -A django_platform``) runs the jobs the platform's view
submits through Django's test client against the shipped simulator; a cancel is refunded; staff
read the library's admin and one with ``reconcile.act_on_jobs`` fails a job from it (the
operator record names them; the customer never sees the reason); the audit is clean; beat on
django-celery-beat's DatabaseScheduler sends the sweep with its expiry; ``manage.py migrate
reconcile zero`` removes the library's tables and columns. The example's own test suites run
under Django's runner and pytest-django; on SQLite a table rebuild is found and repaired.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import Engine, inspect, text
from sqlalchemy.orm import Session

from reconcile import credits
from reconcile.db.migrate import alembic_config
from reconcile.db.session import make_engine
from reconcile.testing.simulator import Script, Simulator
from tests.conftest import PgDatabases
from tests.integration.workers import wait_for

pytest.importorskip("django")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "django_platform"
BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("RECONCILE_", "DJANGO_", "CELERY_", "PLATFORM_"))}
    pythonpath = os.pathsep.join(p for p in (str(ROOT), clean.get("PYTHONPATH")) if p)
    return {**clean, "PYTHONPATH": pythonpath, "DJANGO_SETTINGS_MODULE": "django_platform.settings",
            "NO_PROXY": "127.0.0.1,localhost", **extra}


def _manage(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "manage.py", *args], cwd=EXAMPLE, env=env,
                          capture_output=True, text=True, timeout=120)
    if ok:
        assert proc.returncode == 0, f"manage.py {args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


# one long-lived ``manage.py shell`` of the platform (a Python start-up per request would cost
# seconds each): it reads one JSON command a line and answers ``ANSWER {json}``
_SHELL = """
import json, os, sys
from django.test import Client
for line in sys.stdin:
    command = json.loads(line)
    if command["op"] == "request":
        r = getattr(Client(), command["method"])(
            command["path"], data=command["data"], content_type="application/json",
            headers={"X-User-Id": command["user"]})
        print("ANSWER " + json.dumps({"status": r.status_code, "body": r.json()}), flush=True)
    else:
        os.environ.update(command["env"])
        exec(command["code"], {"__name__": "__probe__"})
        sys.stdout.flush()
"""


class _Shell:
    """The platform's Django, in a ``manage.py shell`` kept open: its test client and scripts."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.stderr = open(log, "wb")  # closed by close()
        self.proc = subprocess.Popen([sys.executable, "manage.py", "shell", "-c", _SHELL],
                                     cwd=EXAMPLE, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True)

    def _ask(self, command: dict[str, Any]) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("ANSWER "):
                return json.loads(line[7:])
        raise AssertionError(f"the platform shell ended: exit {self.proc.wait()}")

    def request(self, method: str, path: str, user: uuid.UUID,
                body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        """One request to the platform's view, through Django's test client."""
        answer = self._ask({"op": "request", "method": method, "path": path, "user": str(user),
                            "data": json.dumps(body) if body is not None else ""})
        return answer["status"], answer["body"]

    def run(self, code: str, **env: str) -> Any:
        """A script that prints its ``ANSWER {json}`` (``env`` set in its environment first)."""
        return self._ask({"op": "exec", "code": code, "env": env})

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.stderr.close()


def _status(engine: Engine, job_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(text("SELECT status FROM jobs WHERE id = :j"), {"j": job_id}).scalar()


def test_django_platform_migrate_check_submit_complete_cancel_audit_and_migrate_zero(
        pg_databases: PgDatabases, redis_url: str, simulator: Simulator, tmp_path: Path) -> None:
    url = pg_databases.create("rtdjango")
    redis.Redis.from_url(redis_url).flushdb()
    env = _env(**simulator.env(), PLATFORM_DATABASE_URL=url.replace("+psycopg", ""),
               CELERY_BROKER_URL=redis_url, PLATFORM_MEDIA_URL=f"file://{tmp_path / 'media'}",
               RECONCILE_TIME_SCALE="0.05", RECONCILE_SWEEP_INTERVAL="20")
    engine = make_engine(url)
    procs: list[subprocess.Popen[bytes]] = []
    shell: _Shell | None = None
    log_path, beat_log = tmp_path / "worker.log", tmp_path / "beat.log"
    try:
        # manage.py migrate: the platform's tables, then the library's revisions
        out = _manage(env, "migrate").stdout
        assert "Applying platform.0001_initial... OK" in out
        assert out.index("platform.0001_initial") < out.index("reconcile.0001_library... OK")
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM reconcile_alembic_version")
                                ).scalar() == head
            id_type = conn.execute(text("SELECT data_type FROM information_schema.columns WHERE "
                                        "table_name = 'usage_logs' AND column_name = 'id'")).scalar()
        assert id_type == "bigint"  # Django's BigAutoField, the database assigns it
        check = _manage(env, "reconcile", "db", "check")
        assert "the database fits the table contract" in check.stdout, check.stdout
        assert "usage_logs.id: bigint with a default" in check.stdout
        # the database is Django's, said so on stderr
        assert "from Django DATABASES['default']" in _manage(env, "reconcile", "stuck").stderr

        user = uuid.uuid4()
        assert "granted 100" in _manage(env, "grant", str(user), "100").stdout
        shell = _Shell(env, tmp_path / "shell.log")
        simulator.script_model("m", Script(timeline=((0.0, "queued"), (0.5, "running"),
                                                     (1.5, "succeeded"))))
        simulator.script_model("slow", Script(timeline=((0.0, "queued"), (0.3, "running"),
                                                        (600.0, "succeeded"))))

        # a Celery worker and beat started from the Django project: the database and settings
        # they use come from the Django settings (nothing in their environment names the database)
        celery = [str(BIN / "celery"), "-A", "django_platform"]
        for argv, path in (
                ([*celery, "worker", "-Q", "celery,reconcile,reconcile.sweep", "--pool=prefork",
                  "-c", "2", "-l", "info", "--without-gossip", "--without-mingle",
                  "-n", f"dj{uuid.uuid4().hex[:6]}@%h"], log_path),
                # django-celery-beat's DatabaseScheduler (CELERY_BEAT_SCHEDULER in the settings)
                ([*celery, "beat", "-l", "info"], beat_log)):
            with open(path, "wb") as log:
                procs.append(subprocess.Popen(argv, cwd=EXAMPLE, env=env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        assert wait_for(lambda: "ready." in log_path.read_text(errors="replace"), 60), \
            log_path.read_text(errors="replace")

        status, body = shell.request("post", "/api/v1/jobs", user, {"model": "m",
                                                                    "input": {"prompt": "a boat"}})
        assert status == 202 and body["state"] == "queued", body
        done = body["job_id"]
        assert wait_for(lambda: _status(engine, done) == "completed", 30), \
            log_path.read_text(errors="replace")[-4000:]
        status, snapshot = shell.request("get", f"/api/v1/jobs/{done}", user)
        assert status == 200 and snapshot["state"] == "completed", snapshot
        assert snapshot["credits_actual"] == 10 and len(snapshot["outputs"]) == 1
        assert simulator.creates() == 1  # one upstream task: no second create

        status, body = shell.request("post", "/api/v1/jobs", user, {"model": "slow"})
        assert status == 202, body
        slow = body["job_id"]
        assert wait_for(lambda: _status(engine, slow) == "processing", 30), \
            log_path.read_text(errors="replace")[-4000:]
        status, body = shell.request("post", f"/api/v1/jobs/{slow}/cancel", user)
        assert status == 200 and body["state"] == "canceled", body
        # the admin: staff read every list; one with reconcile.act_on_jobs fails a job in
        # flight with a reason, through reconcile.operator (the operator record names them)
        status, body = shell.request("post", "/api/v1/jobs", user, {"model": "slow"})
        assert status == 202, body
        failed = body["job_id"]
        assert wait_for(lambda: _status(engine, failed) == "processing", 30), \
            log_path.read_text(errors="replace")[-4000:]
        reason = f"provider support ticket {uuid.uuid4().hex[:8]}: stuck upstream"
        # the admin through Django's test client (tests/integration/django_admin_probe.py)
        seen = shell.run((ROOT / "tests" / "integration" / "django_admin_probe.py").read_text(),
                         PROBE_JOB=failed, PROBE_USER=str(user), PROBE_REASON=reason)
        assert all(code == 200 for code, _ in seen["pages"].values()), seen["pages"]
        assert seen["pages"]["job"][1] and seen["pages"]["inflightjob"][1], seen["pages"]
        assert not seen["pages"]["unsettledjob"][1] and not seen["pages"]["uncertainjob"][1]
        assert seen["filters"] == [True, False] and seen["search"] == [True, True, False], seen
        assert seen["index_lists_reconcile"]
        assert seen["outsider"] == [403, 403]  # staff without the view permission
        assert seen["change"] == {"act_link": True, "events": ["queued", "running"],
                                  "read_only": True}, seen["change"]
        # a staff user without reconcile.act_on_jobs reads, but may not act
        assert seen["viewer"] == {"act_link": False, "get": 403, "post": 403}
        assert ["Fail the job and refund its credits", "allowed"] in seen["act_page"], seen["act_page"]
        assert ["Retry the settlement now", "refused"] in seen["act_page"]
        assert seen["blank_reason"] == ["This field is required."], seen["blank_reason"]
        assert seen["act"] == [302, f"/admin/reconcile/job/{failed}/change/"], seen["act"]
        assert seen["messages"] == [["success", f"Job {failed} failed"]], seen["messages"]
        assert seen["refused"] == [f"Job {failed} is settled already (credits_actual 0)"], seen
        assert seen["operator_log_page"]
        with engine.connect() as conn:
            record = conn.execute(text(
                "SELECT operator, via, action, reason, user_id FROM reconcile_operator_actions "
                "WHERE job_id = :j"), {"j": failed}).all()
        assert [tuple(r) for r in record] == [("ops-ann", "django-admin", "fail", reason, user)]
        # the customer sees the state change, never the reason
        snapshot_status, snapshot = seen["snapshot"]
        assert snapshot_status == 200 and snapshot["state"] == "failed", snapshot
        assert snapshot["credits_returned"] == 10
        assert [e["event"] for e in seen["customer_events"]][-1] == "failed"
        assert reason not in json.dumps(seen["snapshot"]) + json.dumps(seen["customer_events"])

        # 100 granted, 10 committed for the completed job, the cancelled and failed ones refunded
        with Session(engine) as session, session.begin():
            balance = credits.lock_balance(session, user)
            assert (balance.sub, balance.topup) == (90, 0)
        with engine.connect() as conn:
            logs = dict(conn.execute(text(
                "SELECT job_id::text, status FROM usage_logs WHERE user_id = :u"), {"u": user}).all())
        assert set(logs) == {done, slow, failed}, logs

        audit = _manage(env, "reconcile", "audit", ok=False)
        assert audit.returncode == 0, audit.stdout + audit.stderr
        # beat sends the library's sweep and the worker runs it
        assert wait_for(lambda: "reconcile.sweep" in beat_log.read_text(errors="replace")
                        and "[reconcile] scanned=" in log_path.read_text(errors="replace"), 30), \
            beat_log.read_text(errors="replace")[-3000:]
        # django-celery-beat keeps the schedule in PeriodicTask rows: the sweep's tick keeps
        # its expiry there (expire_seconds; the scheduler sends it as the message's expires)
        with engine.connect() as conn:
            row = conn.execute(text(
                "SELECT expire_seconds, expires, queue FROM django_celery_beat_periodictask "
                "WHERE name = 'reconcile-sweep'")).one()
        assert tuple(row) == (1, None, "reconcile.sweep"), row  # 20 s x time scale 0.05
        sent = shell.run(
            "import json\n"
            "from django_celery_beat.models import PeriodicTask\n"
            "from django_celery_beat.schedulers import ModelEntry\n"
            "from django_platform.celery import app\n"
            "entry = ModelEntry(PeriodicTask.objects.get(name='reconcile-sweep'), app=app)\n"
            "print('ANSWER ' + json.dumps([entry.options['expires'], entry.options['queue']]))")
        assert sent == [1, "reconcile.sweep"], sent
    finally:
        if shell is not None:
            shell.close()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    # manage.py migrate reconcile zero: the library's downgrade; the platform's tables and rows stay
    engine.dispose()
    _manage(env, "migrate", "reconcile", "zero")
    tables = set(inspect(engine).get_table_names())
    assert {"jobs", "usage_logs"} <= tables
    assert not {"reconcile_credit_lots", "reconcile_job_events"} & tables, tables
    assert "submission_state" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM jobs")).scalar() == 3
        assert conn.execute(text(
            "SELECT count(*) FROM django_migrations WHERE app = 'reconcile'")).scalar() == 0
    engine.dispose()


def test_django_platform_on_sqlite_and_a_table_remake_that_drops_the_librarys_columns(
        tmp_path: Path) -> None:
    """SQLite (a development database): ``migrate`` and ``db check`` as on PostgreSQL. Django's
    SQLite ``AlterField`` then rebuilds ``jobs`` from the platform's model and drops every column
    and index the library added, while the library's migrations still say head: ``manage.py
    reconcile db check`` names the missing columns with the fix, ``reconcile db repair``, and
    exits 1 (workers and beat refuse to start on it); the repair adds them back."""
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", "media"))
    env = _env(PLATFORM_DATABASE_URL=f"sqlite:///{tmp_path / 'dev.db'}")

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=120)

    assert manage("migrate").returncode == 0
    check = manage("reconcile", "db", "check")
    assert check.returncode == 0 and "the database fits the table contract" in check.stdout, check
    assert "usage_logs.id: INTEGER with a default" in check.stdout

    models = project / "platform_app" / "models.py"
    models.write_text(models.read_text().replace("job_type = models.CharField(max_length=100)",
                                                 "job_type = models.CharField(max_length=200)"))
    assert manage("makemigrations", "platform", "-n", "longer_job_type").returncode == 0
    assert manage("migrate").returncode == 0
    check = manage("reconcile", "db", "check")
    assert check.returncode == 1, check
    assert "BREAKS   jobs.submission_state: missing" in check.stdout
    assert "mismatch(es) with the table contract" in check.stderr
    # the library's migrations are at head: the fix is a repair, not `db upgrade`
    assert "fix: reconcile db repair (the library's migrations are at head" in check.stdout
    assert "fix: reconcile db upgrade" not in check.stdout

    def indexes() -> set[str]:
        import sqlite3

        with sqlite3.connect(tmp_path / "dev.db") as conn:
            return {name for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs'")}

    assert "jobs_inflight_keyset_idx" not in indexes()
    repair = manage("reconcile", "db", "repair")
    assert repair.returncode == 0, repair
    assert "ALTER TABLE jobs ADD COLUMN submission_state TEXT" in repair.stdout
    check = manage("reconcile", "db", "check")
    assert check.returncode == 0 and "the database fits the table contract" in check.stdout, check
    assert {"jobs_inflight_keyset_idx", "jobs_unsettled_idx", "jobs_poll_due_idx"} <= indexes()
    assert manage("reconcile", "db", "repair").stdout.strip().endswith("nothing to repair")


def test_django_platform_own_test_suites_run_on_a_test_database_the_library_uses_and_drops(
        pg_databases: PgDatabases, redis_url: str, tmp_path: Path) -> None:
    """The example's own tests, as a platform runs them: ``manage.py test`` (Django's runner
    with the library's ``ReconcileTestRunner``) and ``pytest`` (pytest-django with the library's
    fixtures). Both run on a test database the library follows, with the shipped simulator and
    ``RECONCILE["eager"]``: a job completes in the request, a create waits for the platform's
    commit, a rolled-back submit is withdrawn and never reaches the provider; staff resolve an
    uncertain submission from the admin. Django's runner also runs the library's own cases
    against the example (``django_cases.py``: a commit never taken for a rollback, a rollback
    that never refunds an accepted job, a failed send left to the sweep, the platform's hooks
    in the runtime, the admin's CSRF check, a reason with markup and control characters, a job
    id that is no job, and two staff racing one job). Each runner then
    drops its test database, which the library's pooled connections would block."""
    url = pg_databases.create("rtdjsuite")
    name = url.rsplit("/", 1)[-1]
    env = _env(PLATFORM_DATABASE_URL=url.replace("+psycopg", ""), CELERY_BROKER_URL=redis_url,
               PLATFORM_MEDIA_URL=f"file://{tmp_path / 'media'}")
    # the example's suites and the library's own cases run against it (django_cases.py)
    env["PYTHONPATH"] = os.pathsep.join((str(EXAMPLE), env["PYTHONPATH"],
                                         str(ROOT / "tests" / "integration")))
    engine = make_engine(url)

    def test_databases() -> list[str]:
        with engine.connect() as conn:
            return list(conn.execute(text("SELECT datname FROM pg_database WHERE datname LIKE "
                                          ":n"), {"n": f"test_{name}%"}).scalars())

    try:
        django_runner = _manage(env, "test", "platform_app", "django_cases", "-v", "2", ok=False)
        assert django_runner.returncode == 0, django_runner.stdout + django_runner.stderr
        assert "Ran 17 tests" in django_runner.stderr and "OK" in django_runner.stderr
        assert f"Destroying test database for alias 'default' ('test_{name}')" in \
            django_runner.stderr
        assert test_databases() == []
        pytest_run = subprocess.run([sys.executable, "-m", "pytest", "-q"], cwd=EXAMPLE,
                                    env=env, capture_output=True, text=True, timeout=300)
        assert pytest_run.returncode == 0, pytest_run.stdout + pytest_run.stderr
        assert "2 passed" in pytest_run.stdout
        assert test_databases() == []
        with engine.connect() as conn:  # the platform's real database: nothing migrated here
            assert not inspect(conn).get_table_names()
    finally:
        engine.dispose()
