"""The built wheel, installed into a fresh virtualenv outside the checkout, works on its own.

From a temporary folder (no checkout on ``sys.path``, no ``celeryconfig.py``, no ``alembic/``):
``reconcile db upgrade`` migrates a fresh PostgreSQL database, ``reconcile.celery_app.app`` has
the broker from the environment, the sweep in its beat schedule and the ``reconcile`` queues,
a worker of the installed package completes a job against the shipped simulator, and its beat
sends the sweep, which that worker runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from reconcile.db.session import make_engine
from reconcile.testing.simulator import Script, Simulator
from tests.conftest import PgDatabases
from tests.integration.workers import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


class Installed:
    """A virtualenv holding the wheel, and a working folder outside the checkout."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.venv = base / "venv"
        self.work = base / "work"
        self.work.mkdir()
        self.bin = self.venv / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        clean = {k: v for k, v in os.environ.items()
                 if not k.startswith(("RECONCILE_", "PYTHON", "VIRTUAL_ENV"))}
        return {**clean, "PATH": f"{self.bin}{os.pathsep}{clean.get('PATH', '')}", **extra}

    def run(self, *argv: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=self.work, env=env, capture_output=True, text=True,
                              timeout=timeout)

    def python(self, code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return self.run(str(self.bin / "python"), "-c", textwrap.dedent(code), env=env)


def _checkout_modules() -> set[str]:
    """What the wheel must hold of ``reconcile/``: every module of the checkout and the package
    data pyproject.toml declares."""
    package = ROOT / "reconcile"
    found = {p.relative_to(ROOT).as_posix() for p in package.rglob("*.py")
             if "__pycache__" not in p.parts}
    data = {p.relative_to(ROOT).as_posix()
            for folder in (package / "console" / "templates", package / "console" / "static",
                           package / "contrib" / "django" / "templates")
            for p in folder.rglob("*") if p.is_file()}
    return found | data | {"reconcile/py.typed", "reconcile/migrations/script.py.mako"}


def _wheel_modules(wheel: Path) -> set[str]:
    """The wheel's files under ``reconcile/``. A module the checkout no longer has must not be
    among them: setuptools builds in the checkout's ``build/`` and ships what an earlier build
    left in ``build/lib`` (a ``build/`` from before the layout move of 2265f5d would ship
    ``reconcile/batch_poll.py``, ``reconcile/events.py``, … beside their new homes)."""
    import zipfile

    with zipfile.ZipFile(wheel) as whl:
        return {name for name in whl.namelist() if name.startswith("reconcile/")}


def _checked(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("wheel")
    assert not base.resolve().is_relative_to(ROOT)
    dist = base / "dist"
    _checked(subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
                            capture_output=True, text=True, timeout=300))
    wheels = list(dist.glob("reconcile-*.whl"))
    assert len(wheels) == 1
    assert _wheel_modules(wheels[0]) == _checkout_modules()
    inst = Installed(base)
    # nothing of this interpreter's (PYTHONPATH, an active venv) may leak into the new one: pip
    # would take a reconcile it can see there for "already installed"
    env = inst.env()
    _checked(subprocess.run([sys.executable, "-m", "venv", str(inst.venv)], capture_output=True,
                            text=True, timeout=120, env=env, cwd=inst.work))
    # dependencies come from the pip cache / the local indexes this machine's pip is set up with
    _checked(subprocess.run([str(inst.bin / "python"), "-m", "pip", "install", "-q",
                             "--disable-pip-version-check", str(wheels[0])],
                            capture_output=True, text=True, timeout=600, env=env, cwd=inst.work))
    yield inst


def test_wheel_installed_outside_the_checkout_migrates_configures_and_runs_a_job(
        installed: Installed, pg_databases: PgDatabases, simulator: Simulator,
        redis_url: str) -> None:
    url = pg_databases.create("rtwheel")
    broker = redis_url
    env = installed.env(
        **simulator.env(), RECONCILE_DATABASE_URL=url, RECONCILE_BROKER_URL=broker,
        RECONCILE_STORAGE_URL=f"file://{installed.work / 'media'}", RECONCILE_TIME_SCALE="0.05",
        RECONCILE_BROKER_VISIBILITY_TIMEOUT="60", RECONCILE_SWEEP_INTERVAL="40",  # × 0.05: 2 s
        RECONCILE_MAX_COUNTDOWN="20", RECONCILE_TASK_TIME_LIMIT="30",
        # planted in each create: the simulator counts creates per job id from it
        RECONCILE_WEBHOOK_BASE_URL="https://platform.example/hooks")

    # the package imported is the installed one, and the folder has nothing of the checkout
    where = _checked(installed.python("import reconcile; print(reconcile.__file__)", env)).strip()
    assert Path(where).is_relative_to(installed.venv), where
    assert not (installed.work / "celeryconfig.py").exists()

    out = _checked(installed.run(str(installed.bin / "reconcile"), "db", "upgrade", env=env))
    assert "database upgraded to head" in out
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            head = conn.execute(text("SELECT version_num FROM reconcile_alembic_version")).scalar()
            tables = set(conn.execute(text(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars())
        assert head is not None and int(head) >= 4
        assert {"jobs", "usage_logs", "reconcile_credit_lots", "reconcile_job_events"} <= tables

        conf = json.loads(_checked(installed.python("""
            import json
            from reconcile.celery_app import app
            c = app.conf
            print(json.dumps({"broker": c.broker_url, "queue": c.task_default_queue,
                              "routes": c.task_routes, "beat": {k: v["task"] for k, v in c.beat_schedule.items()},
                              "beat_queue": c.beat_schedule["reconcile-sweep"]["options"]["queue"],
                              "acks_late": c.task_acks_late, "prefetch": c.worker_prefetch_multiplier,
                              "visibility": c.broker_transport_options.get("visibility_timeout")}))
        """, env)))
        assert conf["broker"] == broker
        assert conf["queue"] == "reconcile"
        assert conf["routes"]["reconcile.sweep"] == {"queue": "reconcile.sweep"}
        # the default poll mode (batch) adds beat's poll_due tick
        assert conf["beat"] == {"reconcile-sweep": "reconcile.sweep",
                                "reconcile-poll-due": "reconcile.poll_due"}
        assert conf["beat_queue"] == "reconcile.sweep"
        assert (conf["acks_late"], conf["prefetch"], conf["visibility"]) == (True, 1, 60)

        _purge(broker)
        log_path = installed.base / "worker.log"
        with open(log_path, "wb") as log:
            worker = subprocess.Popen(
                [str(installed.bin / "celery"), "-A", "reconcile.celery_app", "worker",
                 "-Q", "reconcile,reconcile.sweep", "--pool=prefork", "-c", "1", "-l", "info",
                 "--without-gossip", "--without-mingle", "-n", f"wheel{uuid.uuid4().hex[:6]}@%h"],
                cwd=installed.work, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        beat_log = installed.base / "beat.log"
        with open(beat_log, "wb") as log:
            beat = subprocess.Popen(
                [str(installed.bin / "celery"), "-A", "reconcile.celery_app", "beat", "-l", "info",
                 "-s", str(installed.base / "beat-schedule")],
                cwd=installed.work, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        try:
            assert wait_for(lambda: b"ready." in log_path.read_bytes(), 60), log_path.read_text()
            simulator.script_default(Script(timeline=((0.0, "queued"), (0.3, "running"),
                                                      (1.0, "succeeded"))))
            job_id = _checked(installed.python("""
                import uuid
                from reconcile import api, credits
                from reconcile.tasks import get_runtime
                rt = get_runtime()
                user = uuid.uuid4()
                with rt.sessions.begin() as s:
                    credits.grant(s, user, "sub", 100, f"grant:{user}")
                status, body = api.submit(rt, user, "kie-standard", "m", {"prompt": "x"}, 10,
                                          job_type="image")
                assert status == 202, body
                print(body["job_id"])
            """, env)).strip()

            def completed() -> bool:
                with engine.connect() as conn:
                    return conn.execute(text("SELECT status FROM jobs WHERE id = :i"),
                                        {"i": job_id}).scalar() == "completed"

            assert wait_for(completed, 90), log_path.read_text()[-4000:]
            assert simulator.creates(job_id) == 1
            assert "reconcile.create" in log_path.read_text()
            # the installed package's beat sends the sweep, and its worker runs the tick
            assert wait_for(lambda: b"Sending due task reconcile-sweep" in beat_log.read_bytes()
                            and b"[reconcile] scanned=" in log_path.read_bytes(), 60), \
                beat_log.read_text()[-2000:] + log_path.read_text()[-2000:]
        finally:
            _stop(beat)
            _stop(worker)
    finally:
        engine.dispose()


def _purge(url: str) -> None:
    import redis

    redis.Redis.from_url(url).flushdb()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
