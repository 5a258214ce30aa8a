"""``make bench-peers``: the peers workload, every system in turn, side by side in one run.

    python -m bench.peers.run [--jobs 500,2000] [--systems plain-celery,reconcile-chain,...]
                              [--no-recovery] [--saturated] [--no-limits]

Per load level (quiet; with ``--saturated`` a second pass with one CPU burner per core at
nice 0): the machine's limits (:mod:`.limits`), then for each job count every system on a fresh
database (:func:`.measure.run`), then each system's recovery run (200 jobs, every worker
SIGKILLed mid-poll). Writes ``bench/results/peers.json`` and ``peers.md``. Exits 1 when a check
failed (a job not completed, the ledger unbalanced, a job left in flight) or a run errored; the
files are written first. ``make bench`` runs a bounded variant as figure 10 (:func:`bounded`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..common import ROOT, drop_stale_databases, log, purge_broker, server_version
from . import harness, limits, measure
from .harness import System

RESULTS = Path(__file__).resolve().parents[1] / "results"
ALL = ("plain-celery", "reconcile-chain", "reconcile-batch", "dbos")


def systems(names: list[str]) -> list[System]:
    from .reconcile_app import Reconcile

    out: list[System] = []
    for name in names:
        if name == "plain-celery":
            from .plain_celery import PlainCelery

            out.append(PlainCelery())
        elif name == "dbos":
            from .dbos_app import Dbos

            out.append(Dbos())
        elif name in ("reconcile-chain", "reconcile-batch"):
            out.append(Reconcile(name.split("-", 1)[1]))
        else:
            raise SystemExit(f"unknown system {name!r}: one of {', '.join(ALL)}")
    return out


def environment() -> dict[str, Any]:
    import importlib.metadata as md

    import redis

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip() or "?"
    try:
        redis_version = redis.Redis.from_url(harness.BROKER_URL).info()["redis_version"]
    except redis.RedisError:
        redis_version = "?"
    return {"date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S"), "git_head": head,
            "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "postgresql": server_version(),
            "redis": redis_version, "celery": version("celery"), "dbos": version("dbos"),
            "sqlalchemy": version("sqlalchemy"), "loadavg_start": harness.loadavg()}


def measure_all(job_counts: list[int], names: list[str], *, recovery: bool = True,
                loads: tuple[str, ...] = ("quiet",), with_limits: bool = True,
                quick_limits: bool = False, limit_names: tuple[str, ...] = limits.NAMES,
                timeout: float = 600.0,
                recovery_jobs: int = measure.RECOVERY_JOBS,
                keep_logs: Path | None = None) -> dict[str, Any]:
    """Every pass; each run isolated (an error is recorded, the rest still run). Every process
    is stopped and the broker's db flushed at the end, whatever happened."""
    started = time.monotonic()
    res: dict[str, Any] = {"environment": environment(), "passes": {}, "failures": []}
    drop_stale_databases()
    purge_broker(harness.BROKER_URL)
    with tempfile.TemporaryDirectory(prefix="bench-peers-sim-") as tmp:
        sim = harness.SimulatorProcess(Path(tmp) / "simulator.log")
        try:
            for load in loads:
                with harness.burners(load == "saturated") as burning:
                    log(f"=== peers: {load} host" + (f" (burners {burning})" if burning else ""))
                    p: dict[str, Any] = {"burners": len(burning), "runs": {}}
                    res["passes"][load] = p
                    if with_limits:
                        p["limits"] = limits.measure(sim, quick=quick_limits, only=limit_names)
                    for n in job_counts:
                        p["runs"][str(n)] = {}
                        for system in systems(names):
                            p["runs"][str(n)][system.name] = _one(
                                res, f"{load} {n} {system.name}", lambda s=system, n=n:
                                measure.run(s, n, sim, timeout=timeout, keep_logs=keep_logs))
                    if recovery:
                        p["recovery"] = {}
                        for system in systems(names):
                            p["recovery"][system.name] = _one(
                                res, f"{load} recovery {system.name}", lambda s=system:
                                measure.run(s, recovery_jobs, sim, recovery=True,
                                            keep_logs=keep_logs))
        finally:
            harness.stop_all()
            purge_broker(harness.BROKER_URL)
    res["wall_seconds"] = round(time.monotonic() - started, 1)
    return res


def _one(res: dict[str, Any], label: str, fn: Any) -> dict[str, Any]:
    try:
        out: dict[str, Any] = fn()
    except Exception:
        out = {"error": traceback.format_exc()}
        log(f"peers {label} ERROR:\n{out['error']}")
        res["failures"].append(f"{label}: error ({out['error'].strip().splitlines()[-1]})")
        return out
    res["failures"].extend(f"{label}: {f}" for f in out.get("failures", []))
    return out


def bounded(quick: bool = False) -> dict[str, Any]:
    """``make bench`` figure 10: 500 jobs (60 with ``quick``), quiet host, no recovery run; of
    the machine limits only the status reads (figure 2 measures the no-op Celery rate and
    figure 4 pgbench in the same run); each system waits at most 90 s after its last submit.
    Raises AssertionError (the figure fails) when a check failed."""
    res = measure_all([60 if quick else 500], list(ALL), recovery=False, quick_limits=True,
                      limit_names=("simulator_status_reads",), timeout=90.0)
    if res["failures"]:
        raise AssertionError("peers checks failed: " + "; ".join(res["failures"]))
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.run", description=__doc__
                                     .split("\n")[0])
    parser.add_argument("--jobs", default="500,2000", help="job counts, comma-separated")
    parser.add_argument("--systems", default=",".join(ALL), help="comma-separated: " + ", ".join(ALL))
    parser.add_argument("--no-recovery", action="store_true", help="skip the recovery runs")
    parser.add_argument("--saturated", action="store_true",
                        help="a second pass under a saturated host (a CPU burner per core)")
    parser.add_argument("--saturated-only", action="store_true", help="only the saturated pass")
    parser.add_argument("--recovery-jobs", type=int, default=measure.RECOVERY_JOBS,
                        help="jobs in each recovery run")
    parser.add_argument("--no-limits", action="store_true", help="skip the machine limits")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds after the last submit to wait for every job")
    parser.add_argument("--keep-logs", default=None, help="copy each run's logs to this folder")
    parser.add_argument("--out", default=str(RESULTS), help="folder for peers.json / peers.md")
    args = parser.parse_args(argv)
    # a SIGTERM (a CI timeout, kill) unwinds like ^C: every process stopped, databases dropped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    loads = ("saturated",) if args.saturated_only else (
        ("quiet", "saturated") if args.saturated else ("quiet",))
    res = measure_all([int(n) for n in args.jobs.split(",") if n.strip()],
                      [s.strip() for s in args.systems.split(",") if s.strip()],
                      recovery=not args.no_recovery, loads=loads,
                      with_limits=not args.no_limits, timeout=args.timeout,
                      recovery_jobs=args.recovery_jobs,
                      keep_logs=Path(args.keep_logs) if args.keep_logs else None)
    res["args"] = vars(args)
    from .report import markdown

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "peers.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    (out / "peers.md").write_text(markdown(res))
    log(f"wrote {out / 'peers.json'} and {out / 'peers.md'} ({res['wall_seconds']} s)")
    for failure in res["failures"]:
        log(f"FAILED: {failure}")
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
