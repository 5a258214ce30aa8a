"""``make bench``: measure speed and scale, side by side with the seed design and the machine.

Runs the figures in order, each isolated (one failing is recorded and the rest still run),
then writes ``bench/results/latest.json``, ``bench/results/latest.md`` and the PNGs beside them
(``bench/pictures.py``; matplotlib from the ``bench`` extra). Figures are reported,
never asserted: a missed aim does not fail the run; an error in a figure does (exit 1).

    python -m bench.run                 # everything, bounded: ≈ 17–18 min on a loaded 2-core box
    python -m bench.run --full          # make bench-full: the drain waits for all 10,000, figure 3
                                        # waits up to 400 s per run, figure 6 runs 300 s sweeps
    python -m bench.run --quick         # small sizes, a smoke test of the harness (≈ 3 min)

Every figure has a time budget (``BUDGETS``, seconds, the whole figure: setup included, what the
last loaded run took under the bounds); ``latest.md`` prints each figure's wall time beside it.
    python -m bench.run --only fig1,fig5
    python -m bench.run --drain-jobs 3000  # a smaller backlog for figure 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .common import ROOT, drop_stale_databases, log, purge_broker, server_version, summary

RESULTS = Path(__file__).resolve().parent / "results"


def _load() -> dict[str, Any]:
    one, five, _ = os.getloadavg()
    out: dict[str, Any] = {"loadavg_1m": round(one, 2), "loadavg_5m": round(five, 2)}
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        out["cpu_pressure_some_avg10"] = float(line.split("avg10=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        pass
    return out


def _commit_latency_ms() -> dict[str, Any]:
    """Median of a one-row write transaction (BEGIN; UPDATE; COMMIT) on this server: the cost of
    one WAL flush here, which every write transaction of the library pays."""
    import psycopg

    from .common import throwaway_db

    with throwaway_db("commit", migrate=False) as (_, libpq):
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, n int)")
            conn.execute("INSERT INTO t VALUES (1, 0)")
        with psycopg.connect(libpq) as conn:
            samples = []
            for i in range(60):
                t0 = time.perf_counter()
                conn.execute("UPDATE t SET n = n + 1 WHERE id = 1")
                conn.commit()
                if i >= 10:
                    samples.append((time.perf_counter() - t0) * 1000.0)
    return summary(samples, 2)


def _environment() -> dict[str, Any]:
    import celery
    import psycopg
    import redis
    import sqlalchemy

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "?"

    try:
        redis_version = redis.Redis.from_url("redis://127.0.0.1:6379/0").info()["redis_version"]
    except redis.RedisError:
        redis_version = "?"
    return {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "git_head": git("rev-parse", "--short", "HEAD"),
        "git_dirty_files": len([ln for ln in git("status", "--porcelain").splitlines() if ln]),
        "cpus": os.cpu_count(), "platform": platform.platform(),
        "python": platform.python_version(), "postgresql": server_version(),
        "redis": redis_version, "celery": celery.__version__,
        "sqlalchemy": sqlalchemy.__version__, "psycopg": psycopg.__version__,
        "load_at_start": _load(),
        # the poll mode the report's verdicts are on (bench.aims)
        "default_poll_mode": _default_poll_mode(),
    }


def _default_poll_mode() -> str:
    from reconcile import Settings

    return str(Settings().poll_mode)


# each figure's expected wall time under make bench's bounds on a quiet 2-core host (seconds;
# ≈ 17.5 min in all); the bounds themselves are in each figure (fig_drain.BUDGET_S,
# fig_capacity.CAP_S, fig_recovery's rounds). At load 10–17 the run took 1,053 s.
BUDGETS = {"fig1": 80, "fig5": 5, "fig4": 95, "fig2": 160, "fig3": 270, "fig6": 80, "fig7": 45,
           "fig8": 70, "fig9": 45, "fig10": 240}


def _figures(args: argparse.Namespace) -> dict[str, tuple[str, Callable[[], dict[str, Any]]]]:
    from . import (
        drain_floor,
        fig_audit,
        fig_capacity,
        fig_console,
        fig_drain,
        fig_heartbeat,
        fig_ledger,
        fig_query,
        fig_recovery,
        fig_statements,
    )
    from .peers import run as peers_run

    def drain() -> dict[str, Any]:
        result = fig_drain.run(n=args.drain_jobs, quick=args.quick,
                               timeout=fig_drain.FULL_BUDGET_S if args.full else fig_drain.BUDGET_S)
        # the in-process shares (make bench-profile has the full per-function profile)
        result["profile"] = fig_drain.profile(60 if args.quick else 100)
        result["machine_limit_noop"] = fig_drain.noop_rate(1000 if args.quick else 2000)
        # the same per-job work with no library and no Celery: the ceiling of a Python drain here
        result["lean_floor"] = drain_floor.run(500 if args.quick else 2000)
        return result

    return {
        "fig1": ("Sweep candidate query vs history size", lambda: fig_query.run(args.quick)),
        "fig5": ("Database statements per job", lambda: fig_statements.run(args.quick)),
        "fig4": ("Ledger throughput vs pgbench", lambda: fig_ledger.run(args.quick)),
        "fig2": ("Backlog drain", drain),
        "fig3": ("In-flight capacity", lambda: fig_capacity.run(
            quick=args.quick, batch={"auto": None, "on": True, "off": False}[args.batch],
            timeout=fig_capacity.FULL_CAP_S if args.full else fig_capacity.CAP_S)),
        "fig6": ("Recovery after SIGKILL of a whole worker",
                 lambda: fig_recovery.run(args.quick, full=args.full)),
        "fig7": ("Ledger audit on 1M transactions: full and --since",
                 lambda: fig_audit.run(args.quick, prebuilt=_PREBUILT.pop("fig7", None))),
        "fig8": ("Operator console on 1M jobs: render time and EXPLAIN of its lists",
                 lambda: fig_console.run(args.quick)),
        "fig9": ("Recovery after SIGKILL of every worker, default settings (heartbeats)",
                 lambda: fig_heartbeat.run(args.quick)),
        "fig10": ("Peers: reconcile beside plain Celery and DBOS, one workload (500 jobs, quiet)",
                  lambda: peers_run.bounded(args.quick)),
    }


_PREBUILT: dict[str, Any] = {}  # figure → its fixture built ahead (in a thread)


_SWEEP_OK: list[bool] = []


def _sweep_ready(timeout: float = 600.0) -> None:
    """The sweep-dependent figures wait until ``reconcile.sweep`` imports cleanly (probed once
    per run: a probe is a fresh interpreter, ≈ 5 s on a loaded host)."""
    if _SWEEP_OK:
        return
    deadline = time.monotonic() + timeout
    while True:
        probe = subprocess.run([sys.executable, "-c", "import reconcile.sweep as s; s.sweep; "
                                "s.reconcile_job"], cwd=ROOT, capture_output=True, text=True)
        if probe.returncode == 0:
            _SWEEP_OK.append(True)
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"reconcile.sweep does not import: {probe.stderr[-500:]}")
        log("reconcile.sweep not importable yet; waiting")
        time.sleep(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run")
    parser.add_argument("--quick", action="store_true", help="small sizes (harness smoke test)")
    parser.add_argument("--full", action="store_true",
                        help="unbounded full-size variants (make bench-full; ≈ 35–40 min)")
    parser.add_argument("--only", default="", help="comma-separated figures, e.g. fig1,fig5")
    parser.add_argument("--drain-jobs", type=int, default=10_000,
                        help="stale jobs for figure 2 (the issue's size, measured in full)")
    parser.add_argument("--batch", choices=("auto", "on", "off"), default="auto",
                        help="figure 3's batch poll mode: auto = when reconcile.poll_due exists")
    parser.add_argument("--out", default=str(RESULTS), help="folder for latest.json / latest.md")
    args = parser.parse_args(argv)

    started = time.monotonic()
    from . import common

    common.DEFERRED_DROPS = []  # every throwaway database is dropped after the last figure
    drop_stale_databases()
    purge_broker()
    results: dict[str, Any] = {"environment": _environment(), "args": vars(args),
                               "figures": {}}
    results["environment"]["commit_latency_ms"] = _commit_latency_ms()
    figures = _figures(args)
    wanted = [f.strip() for f in args.only.split(",") if f.strip()] or list(figures)
    failed = False
    for key in wanted:
        title, fn = figures[key]
        if key == "fig6" and "fig7" in wanted[wanted.index(key):]:
            # overlap: figure 7's 1M-transaction ledger is built while figure 6 mostly sleeps
            # (its latency is leases and sweep ticks on timers; latest.md says so)
            from . import fig_audit

            _PREBUILT["fig7"] = fig_audit.Prebuilt(args.quick)
            overlap = "figure 7's ledger (1M transactions) was built in a thread during this figure"
        else:
            overlap = None
        if key in ("fig1", "fig2", "fig6"):
            _sweep_ready()
        log(f"=== {key}: {title}")
        entry: dict[str, Any] = {"title": title, "load_before": _load(),
                                 "budget_s": None if args.full or args.quick else BUDGETS.get(key)}
        if overlap:
            entry["overlap"] = overlap
        t0 = time.monotonic()
        try:
            entry["result"] = fn()
        except Exception:  # one figure failing must not lose the others
            failed = True
            entry["error"] = traceback.format_exc()
            log(f"{key} FAILED:\n{entry['error']}")
        entry["seconds"] = round(time.monotonic() - t0, 1)
        entry["load_after"] = _load()
        results["figures"][key] = entry
        log(f"=== {key} done in {entry['seconds']}s")
    for left in _PREBUILT.values():  # built for a figure that did not run
        left.close()
    t_drop = time.monotonic()
    common.drop_deferred()
    results["drop_databases_seconds"] = round(time.monotonic() - t_drop, 1)
    results["wall_seconds"] = round(time.monotonic() - started, 1)
    results["environment"]["load_at_end"] = _load()

    from .pictures import draw
    from .report import markdown

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    for old in out.glob("fig*.png"):  # no picture of an earlier run may stay beside this one
        old.unlink()
    pictures = draw(results, out)
    (out / "latest.md").write_text(markdown(results, pictures))
    log(f"wrote {out / 'latest.json'} and {out / 'latest.md'} "
        f"(bench wall time {results['wall_seconds']}s)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
