"""The peers benchmark's plumbing: processes in groups of their own, the simulator process, CPU
per process group, the CPU burners of a saturated host.

Nothing here asserts a timing: the figures are reported, never enforced.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common import ROOT

INTERVAL_S = 5.0  # kie-standard's poll interval, and the peers' countdown / sleep
GENERATION_S = 30.0  # each upstream task is done this long after its create
CREDITS = 10  # per job
USERS = 100
GRANT = 10**9
# a Redis database of its own (the tests use 0-2 and 8-15, make bench 12; see tests/conftest.py)
BROKER_URL = os.environ.get("RECONCILE_BENCH_PEERS_BROKER", "redis://127.0.0.1:6379/4")
PYTHON = sys.executable
SCRIPT = {"timeline": [[0.0, "queued"], [1.0, "running"], [GENERATION_S, "succeeded"]]}


_LIVE: list[Proc] = []  # every process started and not yet stopped (stop_all ends them)


class Proc:
    """A subprocess in a process group of its own (its children die with it), log to a file."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        _LIVE.append(self)
        self.argv = list(argv)
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop() / kill()
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env={**os.environ, **env},
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[:4]} exited: {self.text()[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"no {needle!r} in {self.log_path}: {self.text()[-3000:]}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole group at once (a crash: nothing runs its shutdown)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self._closed()

    def _closed(self) -> None:
        self._log.close()
        if self in _LIVE:
            _LIVE.remove(self)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the group, then SIGKILL what is left after ``grace`` seconds."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:  # pool children that outlived their parent
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=30)
        self._closed()


def stop_all(keep: Sequence[Proc] = (), grace: float = 5.0) -> None:
    """Stop every process still running but ``keep`` (whatever happened before): SIGTERM to
    every group at once, then SIGKILL what is left after ``grace`` seconds."""
    procs = [p for p in _LIVE if p not in keep]
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        try:
            proc.kill()
        except Exception:  # one that will not die must not keep the others running
            pass


def celery_worker(app: str, queues: str, env: Mapping[str, str], log_path: Path) -> Proc:
    """One ``celery worker``, prefork with two pool processes: the worker shape every Celery
    system here runs (and the no-op limit is measured on)."""
    celery = str(Path(PYTHON).parent / "celery")
    return Proc([celery, "-A", app, "worker", "--pool=prefork", "--concurrency=2", "-Q", queues,
                 "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "info",
                 "-n", f"peers{time.time_ns()}@%h"], env, log_path)


class SimulatorProcess:
    """``python -m reconcile.testing.simulator`` on a free loopback port, for the whole run."""

    def __init__(self, log_path: Path) -> None:
        from reconcile.testing.simulator import SimulatorClient

        self.proc = Proc([PYTHON, "-m", "reconcile.testing.simulator", "--port", "0"], {},
                         log_path)
        self.proc.wait_for("RECONCILE_KIE_API_KEY=", 60)
        lines = self.proc.text().splitlines()
        self.url = next(line for line in lines if line.startswith("http://"))
        self.env = dict(line.split("=", 1) for line in lines if line.startswith("RECONCILE_"))
        self.client = SimulatorClient(self.url, timeout=60)
        self.reset()

    def reset(self) -> None:
        """No tasks, no counters; every task follows :data:`SCRIPT` (done 30 s after create)."""
        from reconcile.testing.simulator import Script

        self.client.reset()
        self.client.script_default(Script.from_dict(SCRIPT))

    def tasks(self) -> dict[str, dict[str, Any]]:
        return {t["task_id"]: t for t in self.client.tasks()}

    def creates_per_job(self) -> dict[str, int]:
        return {c["job_id"]: int(c["count"]) for c in self.client.counters()["creates"]
                if c.get("job_id")}

    def stop(self) -> None:
        self.client.close()
        self.proc.stop()


@dataclass
class Setup:
    """One system's run: its fresh database, the shared simulator, its folders."""

    db: str
    sa_url: str
    sim: SimulatorProcess
    media: Path
    logs: Path
    broker: str = BROKER_URL


class System:
    """What the driver needs of a system. The defaults are the peers' (the tables of
    :mod:`.ledger`); :mod:`.reconcile_app` overrides them."""

    name = ""
    module = ""  # bench.peers.<module>.web_submitter() runs in the web tier's process
    migrated = False  # the fresh database is a copy of the library's migrated template
    table, task_column = "peer_jobs", "task_id"  # where the driver reads the jobs' progress
    # a Celery system's app (``celery -A``; None: not Celery) and the family of its phase
    # markers in the worker profile (bench.peers.profile.PHASES)
    celery_app: str | None = None
    family = ""

    def env(self, s: Setup) -> dict[str, str]:
        return {"BENCH_DB_URL": s.sa_url, "BENCH_BROKER_URL": s.broker,
                "BENCH_UPSTREAM_URL": s.sim.env["RECONCILE_KIE_BASE_URL"],
                "BENCH_UPSTREAM_KEY": s.sim.env["RECONCILE_KIE_API_KEY"],
                "BENCH_MEDIA_DIR": str(s.media)}

    def prepare(self, s: Setup, users: list[uuid.UUID]) -> None:
        from sqlalchemy import create_engine

        from . import ledger

        engine = create_engine(s.sa_url)
        with engine.begin() as conn:
            ledger.create_schema(conn)
            ledger.grant(conn, users, GRANT)
        engine.dispose()

    def start_workers(self, s: Setup, tag: str) -> list[Proc]:
        """Two worker processes, started and ready."""
        raise NotImplementedError

    def start_extras(self, s: Setup, tag: str) -> list[Proc]:
        """Processes besides the workers (a scheduler), never killed by the recovery run."""
        return []

    def jobs(self, engine: Any) -> list[Any]:
        """(id, status, task_id, completed_at) of every job."""
        from sqlalchemy import text

        with engine.connect() as conn:
            return list(conn.execute(text(
                "SELECT id, status, task_id, completed_at FROM peer_jobs")).all())

    def ledger(self, engine: Any) -> dict[str, Any]:
        from . import ledger

        with engine.connect() as conn:
            return ledger.check(conn)


def redis_pid(port: int = 6379) -> int | None:
    """The local redis-server's pid (psutil), or None."""
    import psutil

    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            if p.info["name"] == "redis-server" and f":{port}" in " ".join(p.info["cmdline"] or ()):
                return int(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def tree(pid: int) -> list[int]:
    import psutil

    try:
        return [pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def _cpu(pid: int) -> float | None:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class CpuTracker(threading.Thread):
    """CPU seconds (user + system, psutil) used by each process group between :meth:`begin` and
    :meth:`end`. Every ``interval`` it lists each group's pids and reads their CPU time; a pid
    present at :meth:`begin` counts from its CPU time then, a pid seen later from zero (it
    started inside the window), a pid gone counts up to its last reading (so a process that
    lives less than one interval is missed)."""

    def __init__(self, groups: Mapping[str, Callable[[], list[int]]], interval: float = 0.5):
        super().__init__(daemon=True)
        self.groups = dict(groups)
        self.interval = interval
        self.base: dict[str, dict[int, float]] = {g: {} for g in groups}
        self.last: dict[str, dict[int, float]] = {g: {} for g in groups}
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def _sample(self, baseline: bool = False) -> None:
        for group, pids in self.groups.items():
            try:
                listed = pids()
            except Exception:  # a group's lister failing (a connection) skips one sample
                continue
            for pid in listed:
                value = _cpu(pid)
                if value is None:
                    continue
                with self._lock:
                    if baseline:
                        self.base[group][pid] = value
                    self.last[group][pid] = value

    def begin(self) -> None:
        self._sample(baseline=True)
        self.start()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self._sample()

    def end(self) -> dict[str, float]:
        self._sample()
        self._halt.set()
        self.join(timeout=10)
        with self._lock:
            return {g: round(sum(v - self.base[g].get(pid, 0.0) for pid, v in self.last[g].items()),
                             3) for g in self.groups}


@contextmanager
def burners(on: bool) -> Iterator[list[int]]:
    """A saturated host: one CPU burner process per core at nice 0 while the block runs
    (killed after it, whatever happens)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if on:
            for _ in range(os.cpu_count() or 1):
                procs.append(subprocess.Popen([PYTHON, "-c", "while True: pass"],
                                              start_new_session=True))
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)
