"""One system's run of the peers workload (throughput), and its recovery run.

Each run: a fresh database (dropped after), the Redis db flushed before and after, the shared
simulator reset, the system's workers started and ready; then the web tier (a process of its
own) submits the N jobs and the driver waits until every job is terminal. Every process
started is stopped in the end, whatever happened.

* **CPU per job by group**: psutil over the window (web start → last job terminal) of the
  workers (process trees; a scheduler beside them counts here too), the PostgreSQL backends
  serving the database (``pg_stat_activity``; the driver's own excluded), redis-server (shared:
  other users of the server count too) and the simulator process;
* **transactions per job**: ``pg_stat_database.xact_commit`` of the database across the window
  (read after every process disconnected, so each backend flushed its counts; the driver's
  reads commit nothing);
* **delay past upstream done**: the job's result time (``completed_at``) − (its upstream task's
  create time in the simulator + 30 s, the script), in poll intervals (5 s);
* **recovery**: 200 jobs; once every one has its upstream task and one interval passed (each is
  mid-poll), SIGKILL every worker process group at once and start new ones at once; the delay
  of each job as above (a job not terminal at the cap counts its delay so far: a lower bound).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from ..common import PG_ADMIN_URL, log, pct, purge_broker, summary, throwaway_db
from . import harness
from .harness import (
    GENERATION_S,
    INTERVAL_S,
    PYTHON,
    USERS,
    CpuTracker,
    Proc,
    Setup,
    SimulatorProcess,
    System,
    redis_pid,
    tree,
)

TERMINAL = ("completed", "failed", "cancelled")
RECOVERY_JOBS = 200
RECOVERY_CAP_S = 180.0  # after the kill


class _Driver:
    """The driver's own connection to the system's database (progress reads), excluded from the
    PostgreSQL CPU. Its reads run in one READ COMMITTED transaction (each statement sees what
    was committed before it), rolled back at the end: they add no commit to the count."""

    def __init__(self, libpq: str, system: System) -> None:
        self.conn = psycopg.connect(libpq)
        self.pid = self.conn.info.backend_pid
        done = f"status IN {TERMINAL!r}"
        self.sql = (f"SELECT count(*), count(*) FILTER (WHERE {done}), count(*) FILTER (WHERE "
                    f"{system.task_column} IS NOT NULL OR {done}) FROM {system.table}")

    def progress(self) -> tuple[int, int, int]:
        """(jobs, terminal, past their create: with an upstream task, or terminal)."""
        row = self.conn.execute(self.sql).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    def close(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


def _xacts(db: str) -> int:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                           (db,)).fetchone()
    return int(row[0]) if row else 0


def _backends(db: str, exclude: int) -> Any:
    conn = psycopg.connect(PG_ADMIN_URL, autocommit=True)

    def pids() -> list[int]:
        return [int(r[0]) for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
            (db, exclude)).fetchall()]

    return conn, pids


def _wait(predicate: Any, deadline: float, interval: float = 1.0) -> bool:
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _delays(rows: list[Any], tasks: dict[str, dict[str, Any]], end: datetime
            ) -> tuple[list[float], list[float], list[datetime]]:
    """Per job: the delay past its upstream's done time in seconds (completed jobs), the delay
    so far of a job not terminal (a lower bound), and the completion times."""
    done_delays, open_delays, completions = [], [], []
    for row in rows:
        task = tasks.get(row.task_id) if row.task_id else None
        if task is None:
            continue
        created = datetime.fromisoformat(task["created_at"].replace("Z", "+00:00"))
        upstream_done = created + timedelta(seconds=GENERATION_S)
        if row.status == "completed" and row.completed_at is not None:
            at = _aware(row.completed_at)
            done_delays.append((at - upstream_done).total_seconds())
            completions.append(at)
        elif row.status not in TERMINAL:
            open_delays.append(max(0.0, (end - upstream_done).total_seconds()))
    return done_delays, open_delays, completions


def _creates(tasks: dict[str, dict[str, Any]], first: datetime) -> dict[str, Any]:
    """When the upstream creates happened, in seconds after the first submit (the simulator's
    create times): every job's 30 s starts there, so the last create bounds the window."""
    at = sorted((datetime.fromisoformat(t["created_at"].replace("Z", "+00:00")) - first)
                .total_seconds() for t in tasks.values())
    if not at:
        return {"n": 0}
    span = at[-1] - at[0]
    return {"n": len(at), "first_s": round(at[0], 2), "p50_s": round(pct(at, 50), 2),
            "last_s": round(at[-1], 2), "per_s": round((len(at) - 1) / span, 1) if span else None}


def _intervals(done: list[float], still_open: list[float]) -> dict[str, Any]:
    """p50/p99 of the delay in poll intervals over every job (a job still open counts its delay
    so far; ``lower_bound`` when it decides the percentile)."""
    every = done + still_open
    if not every:
        return {"n": 0}
    out = {q: round(pct(every, p) / INTERVAL_S, 2) for q, p in (("p50", 50), ("p99", 99))}
    out["max"] = round(max(every) / INTERVAL_S, 2)
    out["lower_bound"] = bool(still_open)
    out["n"] = len(every)
    return out


def _checks(out: dict[str, Any], n: int, *, recovery: bool) -> list[str]:
    """What must hold: every job completed (throughput runs), none in flight, the ledger
    balanced (both)."""
    failures = []
    status = out["ledger"]["by_status"]
    if out["ledger"]["problems"]:
        failures.append(f"ledger not balanced: {out['ledger']['problems']}")
    if not recovery:
        if status.get("completed", 0) != n:
            failures.append(f"{status.get('completed', 0)} of {n} jobs completed: {status}")
        if out["in_flight"]:
            failures.append(f"{out['in_flight']} jobs left in flight")
    return failures


def run(system: System, n: int, sim: SimulatorProcess, *, recovery: bool = False,
        timeout: float = 600.0, keep_logs: Path | None = None) -> dict[str, Any]:
    """One run; ``timeout``: how long after the last submit to wait for every job (the
    recovery run waits :data:`RECOVERY_CAP_S` after the kill instead)."""
    from sqlalchemy import create_engine

    purge_broker(harness.BROKER_URL)
    sim.reset()
    users = [uuid.uuid4() for _ in range(USERS)]
    out: dict[str, Any] = {"system": system.name, "jobs": n,
                           "run": "recovery" if recovery else "throughput",
                           "loadavg_before": harness.loadavg()}
    slug = system.name.replace("-", "_")
    with throwaway_db(f"peers_{slug}", migrate=system.migrated) as (url, libpq), \
            tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        tmpd = Path(tmp)
        (tmpd / "media").mkdir()
        s = Setup(url.rsplit("/", 1)[-1], url, sim, tmpd / "media", tmpd)
        system.prepare(s, users)
        (tmpd / "users.json").write_text(json.dumps([str(u) for u in users]))
        driver = _Driver(libpq, system)
        tracker_conn, backends = _backends(s.db, driver.pid)
        phases: dict[str, float] = {}
        t0 = time.monotonic()
        try:
            extras = system.start_extras(s, "a")
            workers = system.start_workers(s, "a")
            redis = [p for p in [redis_pid()] if p]
            tracker = CpuTracker({
                "workers": lambda: [p for w in workers + extras for p in tree(w.pid)],
                "postgres": backends, "redis": lambda: redis,
                "simulator": lambda: tree(sim.proc.pid)})
            web = Proc([PYTHON, "-m", "bench.peers.web", system.module, str(n),
                        str(tmpd / "users.json"), str(tmpd / "web.json")], system.env(s),
                       tmpd / "web.log")
            web.wait_for("web tier ready", 120)  # set up and connected; waits for the go
            phases["setup"] = round(time.monotonic() - t0, 1)
            x0 = _xacts(s.db)
            tracker.begin()
            (tmpd / "web.json.go").touch()
            t0 = time.monotonic()
            if web.proc.wait(timeout=1800) != 0:
                raise RuntimeError(f"the web tier failed: {web.text()[-3000:]}")
            web.stop()
            submitted = json.loads((tmpd / "web.json").read_text())
            if recovery:
                out.update(_kill_and_restart(system, s, workers, driver, n))
                deadline = time.monotonic() + RECOVERY_CAP_S - out["restart_ready_s"]
            else:
                deadline = time.monotonic() + timeout
            finished = _wait(lambda: driver.progress()[1] == n, deadline)
            end = datetime.now(UTC)
            cpu = tracker.end()
            phases["run"] = round(time.monotonic() - t0, 1)
            t0 = time.monotonic()
            harness.stop_all(keep=[sim.proc])
            driver.close()
            tracker_conn.close()
            time.sleep(1.0)  # the backends' last counts reach pg_stat_database
            xacts = _xacts(s.db) - x0
            phases["stop"] = round(time.monotonic() - t0, 1)
        finally:
            harness.stop_all(keep=[sim.proc])
            driver.close()
            tracker_conn.close()
            if keep_logs is not None:
                dest = keep_logs / f"{system.name}-{n}-{out['run']}-{int(time.time())}"
                shutil.copytree(tmpd, dest, ignore=shutil.ignore_patterns("media", "*.png"))
        engine = create_engine(url)
        try:
            rows = system.jobs(engine)
            out["ledger"] = system.ledger(engine)
        finally:
            engine.dispose()
    purge_broker(harness.BROKER_URL)
    tasks, creates = sim.tasks(), sim.creates_per_job()
    done, still_open, completions = _delays(rows, tasks, end)
    first = datetime.fromtimestamp(submitted["started_at"], UTC)
    window = (max(completions) - first).total_seconds() if completions else None
    out.update({
        "finished": finished, "completed": len(done), "in_flight": len(still_open),
        "submit": {"wall_s": round(submitted["wall_s"], 2),
                   "submits_per_s": round(n / submitted["wall_s"], 1),
                   "web_cpu_ms_per_submit": round(1000 * submitted["cpu_s"] / n, 2)},
        "window_s": round(window, 1) if window else None,
        "creates": _creates(tasks, first),
        "jobs_per_s": round(len(done) / window, 2) if window else None,
        "delay_intervals": _intervals(done, still_open),
        "delay_s": summary(done, 2),
        "upstream_creates": sum(creates.values()),
        "duplicate_creates": sum(max(0, c - 1) for c in creates.values()),
        "phases_s": phases, "loadavg_after": harness.loadavg()})
    if recovery:
        killed_at = datetime.fromisoformat(out["killed_at"])
        out["all_terminal_after_kill_s"] = (
            round((max(completions) - killed_at).total_seconds(), 1)
            if finished and completions else None)
    else:
        out["cpu_ms_per_job"] = {g: round(1000 * v / n, 2) for g, v in cpu.items()}
        out["cpu_ms_per_job"]["total"] = round(sum(out["cpu_ms_per_job"].values()), 2)
        out["xacts_per_job"] = round(xacts / n, 2)
    out["failures"] = _checks(out, n, recovery=recovery)
    log(f"peers {system.name} {out['run']} n={n}: {out['completed']} completed, "
        f"{out['jobs_per_s']} jobs/s, delay {out['delay_intervals']}, "
        f"cpu {out.get('cpu_ms_per_job')}, xacts/job {out.get('xacts_per_job')}"
        + (f" FAILED: {out['failures']}" if out["failures"] else ""))
    return out


def _kill_and_restart(system: System, s: Setup, workers: list[Proc], driver: _Driver,
                      n: int) -> dict[str, Any]:
    """Once every job is past its create (its upstream task exists, or the job is already
    terminal) and one more interval passed, SIGKILL every worker (each process group) and start
    new ones at once. ``workers`` is replaced in place."""
    if not _wait(lambda: driver.progress()[2] == n, time.monotonic() + 300, interval=0.5):
        raise RuntimeError(f"not every job got past its create: {driver.progress()}")
    time.sleep(INTERVAL_S + 2.0)  # every job polled at least once: each is mid-poll
    for w in workers:
        w.kill()
    kill = time.monotonic()
    killed_at = datetime.now(UTC)
    workers[:] = system.start_workers(s, "b")
    return {"killed_at": killed_at.isoformat(), "restart_ready_s": round(time.monotonic() - kill, 2),
            "in_flight_at_kill": n - driver.progress()[1]}

