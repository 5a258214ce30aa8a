"""Figure 2 — backlog drain: N stale in-flight jobs reconciled by one worker (prefork, -c 2), in
the default polling mode (batch: ``celery beat`` runs beside it for the ``poll_due`` tick; a row
the tick does not finish inline is made due and the batch poller drains it; chain: it is resumed
as a chain).

Each job is ``accepted``/``processing`` with kind ``kie-standard``, 15 minutes past its
provider call (threshold 10 min), its poll lease expired (the chain is dead) and its upstream
task already ``succeeded`` in the simulator, which answers at once. One ``reconcile.sweep`` task
is sent; the tick handles rows inline for its time budget (``sweep_time_budget``, 5 s); past it,
in batch mode, it makes the rest due a page at a time and the batch poller (both worker
processes) drains them; in chain mode it fans them out in chunks (``reconcile.reconcile_jobs``). Each
reconciliation is the full path: one status read, one media fetch, storage write, the completion
transaction (commit of the reservation, asset row, event). The clock runs from the moment the
sweep task is sent until the last job is ``completed``.

``make bench`` also measures, beside it, the no-op rate of the same worker shape
(:func:`noop_rate`) and the lean floor (:mod:`bench.drain_floor`: the same per-job work from
psycopg and requests alone), so the drain is read against both.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import text

from .common import (
    Proc,
    log,
    make_sender,
    purge_broker,
    throwaway_db,
    wait_until,
    worker_env,
)
from .seed import add_stale_jobs

SEED_RATE = 50 / 300.0  # the seed's cron: 50 rows per 5-minute tick
USERS = 100


# the drain's time budget from the sweep's send: `make bench` bounds the full 10,000 to this and
# reports what completed in it (`make bench-full` waits up to FULL_BUDGET_S for all of them)
BUDGET_S = 120.0
FULL_BUDGET_S = 900.0


def run(n: int = 10_000, quick: bool = False, timeout: float = BUDGET_S,
        mode: str | None = None) -> dict[str, Any]:
    from reconcile.db.session import make_engine
    from reconcile.testing.simulator import Script, Simulator

    n = min(n, 300) if quick else n
    mode = mode or _default_mode()
    result: dict[str, Any] = {"jobs": n, "kind": "kie-standard", "worker": "1 worker, prefork -c 2",
                              "mode": mode,
                              "seed_cron_jobs_per_s": round(SEED_RATE, 3)}
    purge_broker()
    with throwaway_db("drain") as (url, _), tempfile.TemporaryDirectory() as tmp, \
            Simulator() as sim:
        sim.script_default(Script(timeline=((0.0, "succeeded"),), outputs=1))
        engine = make_engine(url)
        t0 = time.perf_counter()
        add_stale_jobs(engine, sim, n, USERS)
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
        log(f"fig2: {n} stale jobs seeded in {time.perf_counter() - t0:.1f}s")

        env = worker_env(url, sim.env(), Path(tmp) / "media", RECONCILE_POLL_MODE=mode)
        worker = Proc.worker(env, Path(tmp) / "worker.log", concurrency=2)
        beat = Proc.beat(env, Path(tmp) / "beat.log", Path(tmp) / "beat-schedule") \
            if mode == "batch" else None
        try:
            worker.wait_ready()
            sender = make_sender()
            curve: list[tuple[float, int]] = []

            def completed() -> int:
                with engine.connect() as conn:
                    return int(conn.execute(text(
                        "SELECT count(*) FROM jobs WHERE status = 'completed'")).scalar_one())

            start = time.monotonic()
            sender.send_task("reconcile.sweep", queue="reconcile.sweep")

            def done() -> bool:
                c = completed()
                curve.append((round(time.monotonic() - start, 2), c))
                return c >= n

            finished = wait_until(done, timeout, interval=0.5)
            elapsed = time.monotonic() - start
            log_text = worker.text()
        finally:
            worker.stop()
            if beat is not None:
                beat.stop()
        with engine.connect() as conn:
            states = dict(conn.execute(text(
                "SELECT status, count(*) FROM jobs GROUP BY status")).all())
        engine.dispose()
        done_n = int(states.get("completed", 0))
        result.update({
            "finished": finished, "completed": done_n, "status_counts": states,
            "budget_s": timeout,
            "seconds": round(elapsed, 1),
            "jobs_per_s": round(done_n / elapsed, 1) if elapsed else None,
            "curve": _thin(curve, 60),
            "sweep_lines": [ln.split("] ", 1)[-1] for ln in log_text.splitlines()
                            if "[reconcile] scanned=" in ln][-3:],
            "fanned_out_messages": sum(1 for ln in log_text.splitlines()
                                       if "reconcile.reconcile_jobs[" in ln and "received" in ln),
            # batch mode: the rows past the tick's budget handed to the batch poller
            "made_due_by_sweep": sum(1 for ln in log_text.splitlines()
                                     if "poll_made_due" in ln and "via=sweep" in ln),
            "upstream_reads": _reads(sim),
        })
    # the steady rate once the tick fanned out (after the inline budget): the slope of the curve
    pts = [p for p in result["curve"] if 0.1 * n <= p[1] <= 0.9 * n]
    if len(pts) >= 2 and pts[-1][0] > pts[0][0]:
        result["steady_jobs_per_s"] = round((pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]), 1)
    rate = result["jobs_per_s"] or 0.0
    result["ratio_to_seed_cron"] = round(rate / SEED_RATE, 0)
    result["seed_cron_seconds_for_n"] = round(n / SEED_RATE)
    if n < 10_000 and rate:
        result["extrapolated_10000_seconds"] = round(10_000 / rate)
    result["target"] = ">= 150 jobs/s"
    return result


def _default_mode() -> str:
    from reconcile.settings import Settings

    return str(Settings().poll_mode)


def _reads(sim: Any) -> int:
    return len(sim.tasks)


def _thin(curve: list[tuple[float, int]], points: int) -> list[tuple[float, int]]:
    if len(curve) <= points:
        return curve
    step = len(curve) / points
    return [curve[int(i * step)] for i in range(points)] + [curve[-1]]


# the library functions whose cost per reconciled job the profile reports (cumulative)
_WATCH = {
    "sweep.reconcile_job (all)": ("reconcile/sweep/tick.py", "reconcile_job"),
    "sweep._plan (lock, decide, claim)": ("reconcile/sweep/claims.py", "_plan"),
    "lifecycle.read_status (provider GET)": ("reconcile/lifecycle/poll.py", "read_status"),
    "lifecycle.finalize_job_with_media": ("reconcile/lifecycle/finalize.py", "finalize_job_with_media"),
    "media.safe_fetch (media GET)": ("reconcile/media/fetch.py", "safe_fetch"),
    "storage.put": ("reconcile/storage.py", "put"),
    "jobstore.mark_completed": ("reconcile/jobstore/terminal.py", "mark_completed"),
    "credits.commit": ("reconcile/credits/_settle.py", "commit"),
    "credits.settled_amount": ("reconcile/credits/_grants.py", "settled_amount"),
    "events.publish": ("reconcile/jobstore/events.py", "publish"),
    "SQLAlchemy Session.execute (all SQL)": ("sqlalchemy/orm/session.py", "execute"),
    "SQLAlchemy flush (ORM unit of work)": ("sqlalchemy/orm/session.py", "_flush"),
    "requests Session.request (all HTTP)": ("requests/sessions.py", "request"),
}


@contextmanager
def stale_rig(n: int, warm: int = 30) -> Iterator[tuple[Any, Any, list[uuid.UUID]]]:
    """``n + warm`` stale kie-standard jobs whose upstream succeeded, in a throwaway database
    beside a simulator; the first ``warm`` are reconciled already. Yields (engine, runtime, the
    ``n`` remaining job ids): figure 2's per-job work without Celery (its profile and
    ``bench.profile_run``'s)."""
    from reconcile.db.session import make_engine, make_sessionmaker
    from reconcile.runtime import Runtime
    from reconcile.storage import LocalStorage
    from reconcile.sweep import reconcile_job
    from reconcile.testing.simulator import Script, Simulator

    with throwaway_db("profile") as (url, _), tempfile.TemporaryDirectory() as tmp, \
            Simulator() as sim:
        sim.script_default(Script(timeline=((0.0, "succeeded"),), outputs=1))
        engine = make_engine(url)
        ids = add_stale_jobs(engine, sim, n + warm, 10)
        rt = Runtime(settings=sim.settings(), sessions=make_sessionmaker(engine),
                     storage=LocalStorage(Path(tmp) / "media"))
        for j in ids[:warm]:
            reconcile_job(rt, j)
        try:
            yield engine, rt, ids[warm:]
        finally:
            engine.dispose()


def profile(n: int = 150) -> dict[str, Any]:
    """``reconcile_job`` in-process (no Celery) on ``n`` stale jobs under cProfile: wall and CPU
    per job, statements per job, and where the time goes (cumulative ms per job)."""
    import cProfile
    import pstats

    from sqlalchemy import event

    from reconcile.sweep import reconcile_job

    with stale_rig(n) as (engine, rt, ids):
        statements = [0]
        event.listen(engine, "before_cursor_execute",
                     lambda *a: statements.__setitem__(0, statements[0] + 1))
        # wall and CPU without the profiler, then the profile on the same jobs' twins
        half = n // 2
        c0, t0 = time.process_time(), time.perf_counter()
        outcomes = [reconcile_job(rt, j) for j in ids[:half]]
        cpu_ms = (time.process_time() - c0) / half * 1000
        wall_ms = (time.perf_counter() - t0) / half * 1000
        per_job_statements = statements[0] / half
        prof = cProfile.Profile()
        prof.enable()
        outcomes += [reconcile_job(rt, j) for j in ids[half:]]
        prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    profiled = n - half
    where: dict[str, float] = {}
    for label, (path, func) in _WATCH.items():
        cum = sum(v[3] for (file, _, name), v in stats.items()
                  if file.endswith(path) and name == func)
        where[label] = round(cum / profiled * 1000, 2)
    return {"jobs": n, "outcomes": {o: outcomes.count(o) for o in set(outcomes)},
            "wall_ms_per_job": round(wall_ms, 1),
            "cpu_ms_per_job_incl_simulator_thread": round(cpu_ms, 1),
            "statements_per_job": round(per_job_statements, 1),
            "profiled_cumulative_ms_per_job": where,
            "note": "in-process, no Celery; the simulator thread shares the process; the "
                    "profiler inflates absolute numbers, read them as shares"}


def noop_rate(n: int = 3000, timeout: float = 180.0) -> dict[str, Any]:
    """The machine's limit for this worker shape: ``n`` no-op tasks (the library's Celery
    settings, prefork -c 2, same broker) — tasks/s from the first send to the last run."""
    import redis

    from .common import BROKER_URL

    purge_broker()
    client = redis.Redis.from_url(BROKER_URL)
    with tempfile.TemporaryDirectory() as tmp:
        worker = Proc.worker({"RECONCILE_BROKER_URL": BROKER_URL}, Path(tmp) / "noop.log",
                             concurrency=2, queues="bench.noop", app="bench.noop_app")
        try:
            worker.wait_ready()
            sender = make_sender()
            start = time.monotonic()
            for _ in range(n):
                sender.send_task("bench.noop", queue="bench.noop")
            sent = time.monotonic() - start
            finished = wait_until(lambda: int(client.get("bench:noop:done") or 0) >= n, timeout,
                                  interval=0.2)
            elapsed = time.monotonic() - start
        finally:
            worker.stop()
    done = int(client.get("bench:noop:done") or 0)
    purge_broker()
    return {"tasks": n, "finished": finished, "seconds": round(elapsed, 1),
            "tasks_per_s": round(done / elapsed, 1), "send_seconds": round(sent, 1),
            "note": "a task that only INCRs a Redis counter, same celeryconfig, 1 worker -c 2"}
