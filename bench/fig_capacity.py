"""Figure 3 — in-flight capacity: 2,000 concurrent 30-second generations through one worker
(prefork, -c 2), polled by the library's fenced poll chains.

The 2,000 jobs are seeded ``accepted``/``processing`` (kind ``kie-standard``: poll every 5 s)
with their reservations, and their upstream tasks created in the simulator at once. Generation
*i* starts at ``t0 + s_i`` (``s_i`` spread evenly over one poll interval, so the poll load is
steady rather than one synchronized burst) and succeeds 30 s later; its chain starts the way
``on_task_created`` starts it: a ``reconcile.poll`` message with a countdown of one interval.
Real time, no scaling. Overhead = ``completed_at`` − (generation start + 30 s): how late, after
the upstream finished, the job was stored as completed. Slots: the pool holds 2 processes whatever
the number of jobs in flight; their busy share comes from the worker log's task runtimes.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from .common import (
    Proc,
    log,
    make_sender,
    purge_broker,
    summary,
    task_runtimes,
    throwaway_db,
    wait_until,
    worker_env,
)
from .seed import add_inflight_jobs, add_users

GENERATION_S = 30.0
INTERVAL_S = 5.0  # kie-standard's poll interval (kinds.py)
USERS = 100


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def run(n: int = 2000, quick: bool = False, timeout: float = 300.0,
        knee: int | None = 400) -> dict[str, Any]:
    """``n`` generations, then (``knee``) a smaller load the worker can poll on time."""
    n = min(n, 200) if quick else n
    result: dict[str, Any] = {"jobs": n, "generation_s": GENERATION_S, "kind": "kie-standard",
                              "poll_interval_s": INTERVAL_S, "time_scale": 1.0,
                              "worker": "1 worker, prefork -c 2", "runs": {}}
    result["runs"][str(n)] = _run_once(n, timeout, "reconcile.celery_app", {})
    if knee and not quick:
        result["runs"][str(knee)] = _run_once(knee, timeout, "reconcile.celery_app", {})
    head = result["runs"][str(n)]
    result["headline"] = {k: head[k] for k in (
        "overhead_s", "overhead_in_poll_intervals", "worker_slots_held", "seed_design_slots",
        "polls_per_s_achieved", "polls_per_s_demanded", "poll_ms_in_flight")}
    result["target"] = "p99 overhead <= 2 poll intervals (10 s) with 2 worker slots"
    return result


def _run_once(n: int, timeout: float, app: str, extra_env: dict[str, str]) -> dict[str, Any]:
    from reconcile.db.session import make_engine
    from reconcile.testing.simulator import Script, Simulator

    purge_broker()
    with throwaway_db("capacity") as (url, _), tempfile.TemporaryDirectory() as tmp, \
            Simulator() as sim:
        engine = make_engine(url)
        users = [uuid.uuid4() for _ in range(USERS)]
        job_ids = [uuid.uuid4() for _ in range(n)]
        worker = Proc.worker(worker_env(url, sim.env(), Path(tmp) / "media", **extra_env),
                             Path(tmp) / "worker.log", concurrency=2, app=app)
        try:
            worker.wait_ready()
            sender = make_sender()
            lead = 8.0  # seconds to seed and publish every chain's first message before t0
            offsets = [INTERVAL_S * i / n for i in range(n)]
            tasks = []
            t0_mono = time.monotonic() + lead
            t0_wall = datetime.now(UTC) + timedelta(seconds=lead)
            for job_id, s in zip(job_ids, offsets, strict=True):
                shift = t0_mono + s - sim.now()  # the simulator's clock is time.monotonic
                sim.script(str(job_id), Script(timeline=(
                    (0.0, "queued"), (shift + 1.0, "running"), (shift + GENERATION_S, "succeeded"))))
                task_id = "task_m_" + sim.new_id(16, "0123456789abcdef")
                sim.create(provider="kie", api="kie-market", model="m", task_id=task_id,
                           callback_url=None, body={"model": "m", "input": {"prompt": "bench"}},
                           job_id=str(job_id))
                tasks.append(task_id)
            with engine.begin() as conn:
                add_users(conn, users)
                add_inflight_jobs(conn, [(j, users[i % USERS], t) for i, (j, t) in
                                         enumerate(zip(job_ids, tasks, strict=True))],
                                  kind="kie-standard", model="m", started=t0_wall,
                                  lease=t0_wall + timedelta(minutes=10))
            for job_id, s in zip(job_ids, offsets, strict=True):
                countdown = max(0.0, t0_mono - time.monotonic()) + s + INTERVAL_S
                sender.send_task("reconcile.poll", args=[str(job_id), 1, 3], countdown=countdown)
            slack = t0_mono - time.monotonic()
            log(f"fig3 [{app}]: {n} generations seeded, chains started {slack:.1f}s before t0")
            rss: list[float] = []
            inflight_peak = 0

            def done() -> bool:
                nonlocal inflight_peak
                children = _children(worker.proc.pid)
                rss.append(_rss_mb(worker.proc.pid) + sum(_rss_mb(c) for c in children))
                with engine.connect() as conn:
                    left = int(conn.execute(text(
                        "SELECT count(*) FROM jobs WHERE status IN ('pending', 'processing')")
                    ).scalar_one())
                if time.monotonic() >= t0_mono + INTERVAL_S:
                    inflight_peak = max(inflight_peak, left)
                return left == 0

            finished = wait_until(done, timeout, interval=1.0)
            wall = time.monotonic() - t0_mono
            log_text = worker.text()
            child_rss = [_rss_mb(c) for c in _children(worker.proc.pid)]
        finally:
            worker.stop()
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, status, completed_at FROM jobs")).all()
        engine.dispose()
    offset_of = dict(zip(job_ids, offsets, strict=True))
    overheads = [(r.completed_at - t0_wall).total_seconds() - offset_of[r.id] - GENERATION_S
                 for r in rows if r.status == "completed" and r.completed_at is not None]
    runtimes = task_runtimes(log_text)
    polls = [(sec, out) for name, sec, out in runtimes if name == "reconcile.poll"]
    busy = sum(sec for _, sec, _ in runtimes)
    over = summary(overheads, 2)
    out: dict[str, Any] = {
        "app": app, "finished": finished, "completed": len(overheads), "overhead_s": over,
        "overhead_in_poll_intervals": {"p50": round(over["p50"] / INTERVAL_S, 2),
                                       "p99": round(over["p99"] / INTERVAL_S, 2)}
        if overheads else None,
        "wall_s_from_t0": round(wall, 1),
        "in_flight_peak_sampled": inflight_peak,
        "worker_slots_held": 2,
        "seed_design_slots": n,
        "poll_tasks": len(polls), "polls_per_job": round(len(polls) / n, 2),
        "poll_ms_in_flight": summary([sec * 1000 for sec, o in polls if o == "in_flight"], 1),
        "poll_ms_completing": summary([sec * 1000 for sec, o in polls if o == "completed"], 1),
        "polls_per_s_achieved": round(len(polls) / wall, 1) if wall else None,
        "polls_per_s_demanded": round(n / INTERVAL_S, 1),
        "slot_busy_share": round(busy / (2 * wall), 2) if wall else None,
        "worker_rss_mb_peak": round(max(rss), 1) if rss else None,
        "pool_child_rss_mb": [round(x, 1) for x in child_rss],
        "fenced_polls": sum(1 for _, o in polls if o == "fenced"),
        "overhead_sorted_sample": [round(x, 2) for x in
                                   sorted(overheads)[::max(1, len(overheads) // 200)]],
    }
    if child_rss:
        per = sum(child_rss) / len(child_rss)
        out["seed_design_memory_gb_estimate"] = round(per * n / 1024.0, 1)
    log(f"fig3 [{app}]: overhead p50 {over.get('p50')} s p99 {over.get('p99')} s, "
        f"{out['polls_per_s_achieved']} polls/s, busy {out['slot_busy_share']}")
    return out
