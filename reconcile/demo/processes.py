"""The demo's moving parts: subprocesses in their own process groups (killed on the way out), the
work folder and the environment every process shares, the printer, the sweep driver thread, batch
mode's poll_due beat thread and the reads of ``jobs`` the story waits on."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ..celery_install import QUEUES
from .plan import SWEEP_EVERY

# ----------------------------------------------------------------------------- processes


class Children:
    """Subprocesses, each the leader of its own process group; :meth:`stop_all` kills the
    groups (SIGTERM, then SIGKILL) and is registered with ``atexit`` — also run on failure."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes] | None]] = []
        self._lock = threading.Lock()

    def spawn(self, name: str, argv: list[str], env: Mapping[str, str],
              log_path: Path | None = None) -> subprocess.Popen[bytes]:
        out = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115
        proc = subprocess.Popen(argv, env=dict(env), stdout=out or subprocess.DEVNULL,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent)
        with self._lock:
            self.procs.append((name, proc, out))
        return proc

    @staticmethod
    def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM,
             grace: float = 4.0) -> None:
        if proc.poll() is None:
            self.signal_group(proc, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        self.signal_group(proc, signal.SIGKILL)  # stragglers of the group, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    def stop_all(self) -> None:
        with self._lock:
            procs, self.procs = self.procs, []
        for _, proc, _ in procs:
            if proc.poll() is None:
                self.signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 4.0
        for _, proc, out in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            self.signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if out is not None:
                out.close()


def _die_with_parent() -> None:
    """Linux: SIGKILL the child if the demo itself is SIGKILLed (no ``finally`` runs then); a
    worker's pool processes exit once their main process is gone."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def worker_argv(name: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "reconcile.celery_app", "worker",
            "--pool=prefork", "-c", "2", "-Q", ",".join(QUEUES), "-n", f"{name}@demo",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"]


def wait_ready(proc: subprocess.Popen[bytes], log_path: Path, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if b" ready." in log_path.read_bytes():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited early:\n{_tail(log_path)}")
        time.sleep(0.05)
    raise TimeoutError(f"worker not ready in {timeout:.0f}s:\n{_tail(log_path)}")


def _tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_bytes()[-size:].decode("utf-8", "replace")
    except OSError:
        return ""

# ----------------------------------------------------------------------------- the platform bits


class Printer:
    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def __call__(self, message: str = "", *, stamp: bool = True) -> None:
        line = f"[{self.elapsed():5.1f}s] {message}" if stamp else message
        with self._lock:
            print(line, flush=True)


@dataclass
class Sweeper:
    """Calls the sweep every ``interval`` seconds in a thread; keeps the tick lines."""

    rt: Any
    interval: float
    say: Printer
    fan_out: Callable[[uuid.UUID], None] | None = None
    ticks: list[tuple[float, str, str]] = field(default_factory=list)
    errors: int = 0  # rows a tick could not handle, summed over the ticks
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="demo-sweep", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def tick(self) -> None:
        from ..sweep import sweep

        at = self.say.elapsed()
        try:
            report = sweep(self.rt, fan_out=self.fan_out)
            line, notes = report.line(), _summarise(report.actions)
            self.errors += report.errors
        except Exception as exc:  # shown, and the invariants will tell
            line, notes = f"[reconcile] tick failed: {exc!r}", ""
            self.errors += 1
        self.ticks.append((at, line, notes))
        if notes:  # quiet ticks are listed in the summary only
            self.say(f"sweep  {line}  ← {notes}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


@dataclass
class PollDueBeat:
    """Batch mode's beat, as ``celery beat`` sends it: ``reconcile.poll_due`` to the workers
    every ``every`` seconds, each expiring after ``expires`` (``Settings.poll_due_tick``), sent
    through the library's own send. The ``filesystem://`` broker keeps an expired tick on disk
    (it has no message TTL); the worker that receives it discards it unrun."""

    every: float
    expires: float
    sent: int = 0
    lost: int = 0  # sends that raised (a broker outage): the next tick is the next one
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="demo-poll-due", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        from ..worker.installed import send

        while not self._stop.is_set():
            try:
                send("reconcile.poll_due", [], expires=self.expires)
                self.sent += 1
            except Exception:
                self.lost += 1
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def _summarise(actions: Iterable[Any]) -> str:
    counts: dict[str, int] = {}
    for action in actions:
        if action.outcome in ("left", "not_found"):
            continue
        key = f"{action.action}:{action.outcome} ({action.row})"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n}× {key}" for key, n in sorted(counts.items()))

# ----------------------------------------------------------------------------- environment


@dataclass
class Setup:
    work: Path
    env: dict[str, str]
    database_url: str
    embedded_db: bool
    embedded_broker: bool
    poll_mode: str = "chain"


def prepare(work: Path, scale: float, hooks_url: str, sim_env: Mapping[str, str]) -> Setup:
    """The work folder and the RECONCILE_* environment every process of the demo shares."""
    given_db = os.environ.get("RECONCILE_DATABASE_URL")
    given_broker = os.environ.get("RECONCILE_BROKER_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_TEST_")}
    db_url = given_db or f"sqlite:///{work / 'reconcile.db'}"
    env.update(sim_env)
    env.update({
        "RECONCILE_DATABASE_URL": db_url,
        "RECONCILE_BROKER_URL": given_broker or "filesystem://",
        "RECONCILE_BROKER_FOLDER": str(work / "broker"),
        "RECONCILE_STORAGE_URL": f"file://{work / 'media'}",
        "RECONCILE_TIME_SCALE": repr(scale),
        "RECONCILE_SWEEP_INTERVAL": repr(SWEEP_EVERY / scale),
        "RECONCILE_WEBHOOK_BASE_URL": hooks_url,
        "PYTHONUNBUFFERED": "1",
    })
    # the configured poll mode (RECONCILE_POLL_MODE, else the library's default), spelled out
    # for every process: the story the demo tells depends on it
    from ..settings import Settings

    env["RECONCILE_POLL_MODE"] = Settings().poll_mode
    # loopback only: never through a proxy
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return Setup(work, env, db_url, given_db is None, given_broker is None,
                 env["RECONCILE_POLL_MODE"])


MARKER = ".reconcile-demo"  # a work folder the demo made (and may wipe)


def wipe(work: Path) -> None:
    """Empty the work folder — only if the demo made it (or it is empty): ``--workdir .`` must
    never delete someone's files."""
    if work.exists() and any(work.iterdir()) and not (work / MARKER).exists():
        raise SystemExit(f"refusing to wipe {work}: not a folder the demo created "
                         f"(no {MARKER} file); pick another --workdir")
    if work.exists():
        shutil.rmtree(work)
    for sub in ("broker/queue", "broker/control", "media", "logs"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    (work / MARKER).touch()


def snapshot(rt: Any, ids: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
    from sqlalchemy import select

    from ..db.models import Job

    with rt.sessions() as session:
        return {j.id: j for j in session.execute(select(Job).where(Job.id.in_(ids))).scalars()}


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def broker_backlog(app: Any, say: Printer, *, purge: bool) -> None:
    """A given broker is never wiped; messages left in its queues (by earlier runs, or by
    workers that died or were stopped holding them) run before this run's and only slow it down
    (each one is fenced or finds its job finished). ``--purge-broker`` empties them."""
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for queue in QUEUES:
            try:
                waiting = channel.queue_declare(queue=queue, passive=True).message_count
            except Exception:  # not declared yet
                continue
            if waiting and purge:
                channel.queue_purge(queue)
                say(f"purged {waiting} old messages from queue {queue!r} (--purge-broker)")
            elif waiting:
                say(f"note: queue {queue!r} already holds {waiting} messages; they run first "
                    f"(--purge-broker empties it)")
