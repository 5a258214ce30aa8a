"""The machine's limits, measured in the same run as the systems (same load level):

* ``pgbench -b simple-update`` tps (2 clients, 2 threads) on a fresh database, scale 1;
* no-op Celery tasks per second on the worker shape every Celery system runs here (one
  ``celery worker``, prefork, two pool processes; :mod:`bench.noop_app`, the library's Celery
  settings; a task that only INCRs a Redis counter);
* status reads per second against the simulator from 2 plain processes (``requests``, one
  session each, the peers' own read: :func:`.upstream.status`) on one running task.
"""

from __future__ import annotations

import glob
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from ..common import log, purge_broker, throwaway_db
from . import harness


def pgbench(seconds: float = 10.0, clients: int = 2) -> dict[str, Any]:
    found = shutil.which("pgbench") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), reverse=True)), None)
    if found is None:
        return {"missing": "pgbench is not installed (PATH or /usr/lib/postgresql/*/bin)"}
    with throwaway_db("peers_pgbench", migrate=False) as (_, libpq):
        subprocess.run([found, "-i", "-s", "1", "-q", libpq], capture_output=True, check=True)
        cmd = [found, "-b", "simple-update", "-c", str(clients), "-j", str(min(clients, 2)),
               "-T", str(int(seconds)), "-n", libpq]
        text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    tps = re.search(r"tps = ([0-9.]+)", text)
    return {"tps": round(float(tps.group(1)), 1) if tps else None, "seconds": seconds,
            "command": " ".join(cmd[:-1]) + " <db>"}


def noop_rate(n: int = 2000, timeout: float = 120.0) -> dict[str, Any]:
    import redis
    from celery import Celery

    counter = "bench:peers:noop"
    purge_broker(harness.BROKER_URL)
    client = redis.Redis.from_url(harness.BROKER_URL)
    with tempfile.TemporaryDirectory() as tmp:
        worker = harness.celery_worker("bench.noop_app", "bench.noop", {
            "RECONCILE_BROKER_URL": harness.BROKER_URL, "BENCH_NOOP_COUNTER": counter},
            Path(tmp) / "noop.log")
        try:
            worker.wait_for("ready.")
            sender = Celery(broker=harness.BROKER_URL, set_as_current=False)
            start = time.monotonic()
            for _ in range(n):
                sender.send_task("bench.noop", queue="bench.noop")
            deadline = start + timeout
            while int(client.get(counter) or 0) < n and time.monotonic() < deadline:
                time.sleep(0.1)
            elapsed = time.monotonic() - start
        finally:
            worker.stop()
    done = int(client.get(counter) or 0)
    purge_broker(harness.BROKER_URL)
    return {"tasks": n, "done": done, "seconds": round(elapsed, 1),
            "tasks_per_s": round(done / elapsed, 1)}


def _reader(env: dict[str, str], task_id: str, start_at: float, until: float,
            queue: Any) -> None:
    os.environ.update(env)
    from . import upstream

    upstream.status(task_id)  # connected before the window
    while time.time() < start_at:
        time.sleep(0.005)
    reads, begun = 0, time.time()
    while time.time() < until:
        upstream.status(task_id)
        reads += 1
    queue.put((reads, time.time() - begun))


def status_reads(sim: harness.SimulatorProcess, seconds: float = 5.0,
                 processes: int = 2) -> dict[str, Any]:
    """Reads per second: each process's reads ÷ its own reading time, summed (all read in the
    same window, unless one was late to start)."""
    sim.reset()
    env = {"BENCH_UPSTREAM_URL": sim.env["RECONCILE_KIE_BASE_URL"],
           "BENCH_UPSTREAM_KEY": sim.env["RECONCILE_KIE_API_KEY"]}
    os.environ.update(env)
    from . import upstream

    task_id = upstream.create("bench-status-reads")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    start_at = time.time() + 5.0  # the children start (spawn, imports) before it
    procs = [ctx.Process(target=_reader, args=(env, task_id, start_at, start_at + seconds,
                                               queue), daemon=True) for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=seconds + 60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    sim.reset()
    return {"processes": processes, "seconds": seconds, "reads": sum(r for r, _ in results),
            "reads_per_s": round(sum(r / t for r, t in results if t > 0), 1)}


NAMES = ("pgbench_simple_update", "celery_noop", "simulator_status_reads")


def measure(sim: harness.SimulatorProcess, *, quick: bool = False,
            only: tuple[str, ...] = NAMES) -> dict[str, Any]:
    """The limits named in ``only`` (each isolated: an error is recorded, the rest still run);
    ``quick``: shorter (pgbench 5 s, 1,000 no-op tasks, 3 s of reads)."""
    out: dict[str, Any] = {"loadavg_before": harness.loadavg()}
    for name, fn in (("pgbench_simple_update", lambda: pgbench(5.0 if quick else 10.0)),
                     ("celery_noop", lambda: noop_rate(1000 if quick else 2000)),
                     ("simulator_status_reads", lambda: status_reads(sim, 3.0 if quick else 5.0))):
        if name not in only:
            continue
        try:
            out[name] = fn()
        except Exception as exc:  # one limit failing must not lose the others
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        log(f"peers limit {name}: {out[name]}")
    out["loadavg_after"] = harness.loadavg()
    return out
