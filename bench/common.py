"""Shared plumbing for the benchmarks: throwaway databases, statistics, real worker processes.

Nothing here asserts on timing: every figure is reported, never enforced (the machine is shared
and noisy).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get("RECONCILE_BENCH_PG_ADMIN",
                              "postgresql://postgres@127.0.0.1:5432/postgres")
# a Redis database of its own (the tests use 13 and 15)
BROKER_URL = os.environ.get("RECONCILE_BENCH_BROKER", "redis://127.0.0.1:6379/12")
CELERY = str(Path(sys.executable).parent / "celery")


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ----------------------------------------------------------------------------- databases


def admin() -> psycopg.Connection:
    return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)


def sa_url(name: str) -> str:
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    return base.replace("postgresql://", "postgresql+psycopg://", 1) + "/" + name


def libpq_url(name: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name


@contextmanager
def throwaway_db(prefix: str, *, migrate: bool = True) -> Iterator[tuple[str, str]]:
    """A fresh database (migrated to head unless ``migrate=False``), dropped afterwards.
    Yields (SQLAlchemy URL, libpq URL)."""
    name = f"bench_{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    template = _migrated_template() if migrate else None
    with admin() as conn:
        if template is None:
            conn.execute(f'CREATE DATABASE "{name}"')
        else:  # a copy of a database migrated once per run: no migration per figure
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield sa_url(name), libpq_url(name)
    finally:
        if DEFERRED_DROPS is not None:  # bench.run: dropped together at the end of the run
            DEFERRED_DROPS.append(name)
        else:
            with admin() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# bench.run sets this to a list: a DROP DATABASE forces a checkpoint (PostgreSQL 15), which
# waited 10–25 s inside the figures on a loaded host; the run drops every database at its end
DEFERRED_DROPS: list[str] | None = None


def drop_deferred() -> None:
    global DEFERRED_DROPS
    names, DEFERRED_DROPS = DEFERRED_DROPS or [], None
    with admin() as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_TEMPLATE: list[str] = []
_TEMPLATE_LOCK = __import__("threading").Lock()


def _migrated_template() -> str:
    with _TEMPLATE_LOCK:
        return _make_template()


def _make_template() -> str:
    """A database migrated to head once per bench process (``bench_template_<pid>_…``, so
    :func:`drop_stale_databases` drops it after the run); every migrated throwaway database is
    a copy of it (``CREATE DATABASE … TEMPLATE``: a file copy, not 20 revisions)."""
    if _TEMPLATE:
        return _TEMPLATE[0]
    import atexit

    from reconcile.db.migrate import upgrade

    name = f"bench_template_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    upgrade(sa_url(name))
    with admin() as conn:  # a template must have no session open on it
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
    _TEMPLATE.append(name)

    def drop() -> None:
        try:
            with admin() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except psycopg.Error:
            pass

    atexit.register(drop)
    return name


def drop_stale_databases() -> None:
    """Databases left by an interrupted earlier run (bench_* only) whose creating process is
    gone: a name carries its creator's pid (``bench_<prefix>_<pid>_<hex>``), so a run never
    drops the databases of another bench still running on the same server."""
    with admin() as conn:
        names = [r[0] for r in conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'bench\\_%'")]
        for name in names:
            parts = name.split("_")
            pid = int(parts[-2]) if len(parts) >= 4 and parts[-2].isdigit() else None
            if pid is not None and _alive(pid):
                continue
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def server_version() -> str:
    with admin() as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]


# ----------------------------------------------------------------------------- statistics


def pct(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0–100), linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    k = (len(ordered) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo))


def summary(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "min": round(min(values), digits),
            "p50": round(pct(values, 50), digits), "p90": round(pct(values, 90), digits),
            "p99": round(pct(values, 99), digits), "max": round(max(values), digits),
            "mean": round(statistics.fmean(values), digits)}


def timed(fn: Callable[[], Any], runs: int, warmup: int = 3) -> list[float]:
    """Wall milliseconds of ``runs`` calls of ``fn`` (after ``warmup`` unrecorded ones)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


# ----------------------------------------------------------------------------- broker & workers


def purge_broker(url: str = BROKER_URL) -> None:
    import redis

    redis.Redis.from_url(url).flushdb()


def make_sender(broker: str = BROKER_URL):  # type: ignore[no-untyped-def]
    """A bare Celery app publishing to the library's queues (as a platform's web tier would)."""
    from celery import Celery

    from reconcile.celery_install import QUEUE, routes
    from reconcile.settings import Settings

    app = Celery(broker=broker, set_as_current=False)
    app.conf.task_default_queue = QUEUE
    app.conf.task_routes = routes(Settings().queue_layout)
    return app


class Proc:
    """A ``celery`` subprocess (worker or beat) in its own process group, log to a file."""

    def __init__(self, args: list[str], env: Mapping[str, str], log_path: Path,
                 app: str = "reconcile.celery_app") -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([CELERY, "-A", app, *args], cwd=ROOT,
                                     env={**os.environ, **env}, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    @classmethod
    def worker(cls, env: Mapping[str, str], log_path: Path, *, concurrency: int = 2,
               queues: str = "reconcile.poll,reconcile.create,reconcile,reconcile.sweep",
               loglevel: str = "info",
               app: str = "reconcile.celery_app") -> Proc:
        return cls(["worker", "--pool=prefork", f"--concurrency={concurrency}", "-Q", queues,
                    "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", loglevel,
                    "-n", f"bench{time.time_ns()}@%h"], env, log_path, app)

    @classmethod
    def beat(cls, env: Mapping[str, str], log_path: Path, schedule: Path) -> Proc:
        return cls(["beat", "-l", "info", "-s", str(schedule)], env, log_path)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, needle: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"celery exited: {self.text()[-2000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"no {needle!r} in the log: {self.text()[-2000:]}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait_for_log("ready.", timeout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the group (warm shutdown), then SIGKILL what is left."""
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        self._log.close()


def worker_env(db_url: str, sim_env: Mapping[str, str], media: Path, *, time_scale: float = 1.0,
               **extra: str) -> dict[str, str]:
    """A bench worker's environment. Chain mode unless ``extra`` says otherwise: the figures
    built on the chain's mechanics (a ``mid_poll`` crash, countdown polls held by a worker, the
    chain's capacity curve) name it; the batch runs pass ``RECONCILE_POLL_MODE=batch``."""
    return {
        **sim_env,
        "RECONCILE_POLL_MODE": "chain",
        "RECONCILE_DATABASE_URL": db_url,
        "RECONCILE_BROKER_URL": BROKER_URL,
        "RECONCILE_STORAGE_URL": f"file://{media}",
        "RECONCILE_TIME_SCALE": repr(time_scale),
        **extra,
    }


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def task_runtimes(log_text: str) -> list[tuple[str, float, str]]:
    """(task name, seconds, returned value) of every ``Task x[id] succeeded in Ns: v`` line of
    a worker log."""
    import re

    return [(m.group(1), float(m.group(2)), m.group(3).strip("'")) for m in re.finditer(
        r"Task (reconcile\.\w+)\[[^\]]+\] succeeded in ([0-9.eE+-]+)s: ?([^\n]*)", log_text)]


def poll_lease_seconds(kind: str = "kie-standard", time_scale: float = 1.0) -> float:
    """The poll lease the library writes at each turn (``lifecycle.poll_lease``, imported, with
    the default settings and ``time_scale``): what a chain must beat between two turns."""
    from types import SimpleNamespace

    from reconcile.kinds import get_kind
    from reconcile.lifecycle import poll_lease
    from reconcile.settings import Settings

    k = get_kind(kind)
    assert k is not None, kind
    rt = SimpleNamespace(settings=Settings(time_scale=time_scale))
    return poll_lease(rt, k).total_seconds()  # type: ignore[arg-type]


def process_cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    """user + system CPU seconds of each live pid (psutil; the ``bench`` extra)."""
    import psutil

    out: dict[int, float] = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (psutil)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return [pid, *(c.pid for c in p.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def backend_pids(conn: Any, db: str) -> list[int]:
    """PostgreSQL backend pids serving database ``db`` (pg_stat_activity), the caller's own
    backend excluded."""
    return [int(r[0]) for r in conn.execute(text_(
        "SELECT pid FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid()"),
        {"db": db}).all()]


def text_(sql: str) -> Any:
    from sqlalchemy import text

    return text(sql)
