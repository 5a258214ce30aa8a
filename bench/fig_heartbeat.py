"""Figure 9 — recovery after SIGKILL of every worker mid-poll, at the default settings: worker
heartbeats, real time (``TIME_SCALE`` 1), in both polling modes. The default mode's figure
decides the recovery aim; the other is reported beside it.

``JOBS`` accepted ``kie-standard`` jobs (5 s interval, upstream never done) are polled by the
only worker (prefork -c 2). Its crash hook (whole process group) is armed once every job was
polled there; at the kill, what the worker held dies with it, and a new worker is started at
once, as a supervisor would. The new worker's heartbeat notices the dead processes
(``HEARTBEAT_TIMEOUT`` 6 s after their last beat, checked every ``HEARTBEAT_INTERVAL`` 2 s) and
ends their claims. A sampler (figure 6's) reads every job's (generation, seq) every 20 ms.

* **chain** (``mid_poll``): no beat, so no sweep tick can help; every chain's next message dies
  with the worker (the broker's visibility timeout is 3600 s). The heartbeat ends the poll
  turns and resumes each chain under a new generation. Latency per job = kill → the first poll
  of a newer generation.
* **batch** (``mid_batch``: right after a claim committed, before its reads): ``celery beat``
  runs throughout with the library's schedule (its ``poll_due`` tick; the sweep's first tick
  is one sweep interval away). The rows the dead processes had claimed would otherwise wait out
  the claim lease; the heartbeat makes them due at once. Latency per claimed row = kill → the
  row's next claim (its seq moves; the read follows in the same task).

A run ends when every affected job has recovered, or at ``HORIZON`` s.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select, text

from .common import (
    Proc,
    log,
    make_sender,
    poll_lease_seconds,
    purge_broker,
    summary,
    throwaway_db,
    wait_until,
    worker_env,
)
from .fig_recovery import Sampler, _latencies
from .seed import add_inflight_jobs, add_users, sim_tasks, spread

JOBS = 200
INTERVAL = 5.0  # kie-standard's poll interval (s): the batch rows' first due times spread over it
LEASE = poll_lease_seconds("kie-standard")
HORIZON = 60.0
CRASH_AT = {"chain": "mid_poll", "batch": "mid_batch"}


def run(quick: bool = False) -> dict[str, Any]:
    from reconcile.settings import Settings

    defaults = Settings()
    out: dict[str, Any] = {"jobs": 40 if quick else JOBS, "time_scale": 1.0,
                           "poll_lease_s": LEASE, "default_mode": defaults.poll_mode,
                           "heartbeat_interval_s": defaults.heartbeat_interval,
                           "heartbeat_timeout_s": defaults.heartbeat_timeout,
                           "claim_lease_s": _claim_lease_s(), "horizon_s": HORIZON}
    modes = [defaults.poll_mode] + [m for m in ("chain", "batch") if m != defaults.poll_mode]
    out["modes"] = {m: _one(m, out["jobs"]) for m in modes}
    return out


def _claim_lease_s() -> float:
    """What a dead process's batch claim would wait without the heartbeat (the claim lease at
    the default settings)."""
    from reconcile.lifecycle import batch
    from reconcile.settings import Settings

    return batch.claim_lease_of(Settings()).total_seconds()


def _one(mode: str, jobs: int) -> dict[str, Any]:
    from reconcile.db.session import make_engine
    from reconcile.testing.simulator import Script, Simulator

    purge_broker()
    batch = mode == "batch"
    with throwaway_db(f"heartbeat_{mode}") as (url, _), tempfile.TemporaryDirectory() as tmp, \
            Simulator() as sim:
        tmpd = Path(tmp)
        sim.script_default(Script(timeline=((0.0, "queued"), (0.1, "running"),
                                             (3600.0, "succeeded"))))
        engine = make_engine(url)
        users = [uuid.uuid4() for _ in range(20)]
        with engine.begin() as conn:
            add_users(conn, users)
        base = worker_env(url, sim.env(), tmpd / "media", RECONCILE_POLL_MODE=mode,
                          RECONCILE_BROKER_VISIBILITY_TIMEOUT="3600")
        marker = tmpd / "crashed"
        marker.touch()  # present: the hook stays quiet until the bench deletes it
        beat = Proc.beat(base, tmpd / "beat.log", tmpd / "beat-schedule") if batch else None
        victim = Proc.worker({**base, "RECONCILE_TEST_CRASH_AT": CRASH_AT[mode],
                              "RECONCILE_TEST_CRASH_MODE": "group",
                              "RECONCILE_TEST_CRASH_ONCE": str(marker)},
                             tmpd / "victim.log", concurrency=2)
        restarted: Any = None
        sampler = Sampler(engine)
        sampler.start()
        try:
            victim.wait_ready()
            ids = [uuid.uuid4() for _ in range(jobs)]
            _seed(engine, sim, ids, users, batch)
            sampler.track(ids)
            if not batch:
                sender = make_sender()
                for j in ids:
                    sender.send_task("reconcile.poll", args=[str(j), 1, 3])
            wait_until(lambda: _all_polled(engine, ids, batch), 60, interval=0.2)
            marker.unlink()
            if not wait_until(marker.exists, 30, interval=0.01):
                raise RuntimeError(f"the victim never reached {CRASH_AT[mode]}")
            kill = os.stat(marker).st_mtime
            wait_until(lambda: not victim.alive(), 10, interval=0.01)
            held = _dead_claims(engine) if batch else {}
            restarted = Proc.worker(base, tmpd / "restarted.log", concurrency=2)
            restarted.wait_ready()
            ready = time.time() - kill

            def measured() -> tuple[list[float], int]:
                snap = sampler.snapshot()
                if batch:
                    return _reclaimed(snap, held, kill, HORIZON)
                parts, left = _latencies(snap, kill, LEASE, HORIZON)
                return [p["latency"] for p in parts], left

            _until_recovered(measured, kill)
            latencies, unresolved = measured()
            logs = restarted.text()
            swept = sum("Sending due task" in line and "reconcile.sweep" in line
                        for line in beat.text().splitlines()) if beat is not None else 0
        finally:
            sampler.stop.set()
            sampler.join(timeout=5)
            for p in (victim, restarted, beat):
                if p is not None:
                    p.stop()
            engine.dispose()
    res = {"crash_at": CRASH_AT[mode], "beat": "celery beat (the library's schedule)" if batch
           else "none (no sweep tick)", "affected": len(latencies) + unresolved,
           "unresolved": unresolved, "restarted_ready_after_kill_s": round(ready, 2),
           "reaps_logged": logs.count("worker_lapsed"), "sweeps_sent": swept,
           "reaper_log": [line for line in logs.splitlines()
                          if any(w in line for w in ("worker_lapsed", "reap workers=",
                                                     "heartbeat_started", "ready."))][-12:],
           "kill_at": kill, "recovery_s": summary(latencies, 2),
           "latencies_s": [round(x, 3) for x in latencies]}
    log(f"fig9 {mode}: {len(latencies)} of {res['affected']} recovered, p50 "
        f"{res['recovery_s'].get('p50')} s p99 {res['recovery_s'].get('p99')} s after the kill "
        f"(restarted worker ready after {ready:.1f} s), unresolved {unresolved}")
    return res


def _seed(engine: Any, sim: Any, ids: list[uuid.UUID], users: list[uuid.UUID],
          batch: bool) -> None:
    """In-flight jobs; in batch mode each is due within one interval (as a fresh accept's
    ``first_due``), spread so that the claims of one tick hold a part of them."""
    tasks = sim_tasks(sim, ids)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        add_inflight_jobs(conn, spread(ids, users, tasks), kind="kie-standard", model="m",
                          started=now, lease=now + timedelta(seconds=LEASE))
        if batch:
            conn.execute(text(
                "UPDATE jobs SET poll_due_at = CAST(:now AS timestamptz) + "
                "make_interval(secs => :interval * v.n / :count) "
                "FROM unnest(CAST(:ids AS uuid[])) WITH ORDINALITY AS v(id, n) "
                "WHERE jobs.id = v.id"),
                {"now": now, "interval": INTERVAL, "count": len(ids),
                 "ids": [str(j) for j in ids]})


def _all_polled(engine: Any, ids: list[uuid.UUID], batch: bool) -> bool:
    """Chain: every chain holds a turn on the victim; batch: every row was claimed once."""
    cond = "poll_seq > 3" if batch else "claimed_by IS NOT NULL"
    with engine.connect() as conn:
        return conn.execute(text(
            f"SELECT count(*) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[])) AND {cond}"),
            {"ids": [str(j) for j in ids]}).scalar_one() == len(ids)


def _dead_claims(engine: Any) -> dict[str, int]:
    """The batch claims the killed worker held at the kill (only it ran: every registered
    worker process is its), each with its seq: the library's own predicate of a live claim."""
    from sqlalchemy.orm import Session

    from reconcile.db.models import Job, WorkerHeartbeat
    from reconcile.jobstore import live_batch_claims

    with Session(engine) as s:
        workers = list(s.scalars(select(WorkerHeartbeat.worker_id)))
        now = datetime.now(UTC)
        return {str(r.id): r.poll_seq for r in s.execute(
            select(Job.id, Job.poll_seq).where(*live_batch_claims(workers, now)))}


def _reclaimed(history: dict[str, list[tuple[float, int, int]]], held: dict[str, int],
               kill: float, horizon: float) -> tuple[list[float], int]:
    """Per row a dead process had claimed: kill → its next claim (seq past the claim's)."""
    out, unresolved = [], 0
    for job_id, seq in held.items():
        after = [at for at, _, s in history.get(job_id, []) if kill < at <= kill + horizon
                 and s > seq]
        if after:
            out.append(after[0] - kill)
        else:
            unresolved += 1
    return out, unresolved


def _until_recovered(measured: Callable[[], tuple[list[float], int]], kill: float) -> None:
    """Wait until nothing affected is unresolved (a short grace for the sampler), or the
    horizon."""
    while time.time() < kill + HORIZON:
        done, left = measured()
        if done and not left:
            time.sleep(0.5)
            return
        time.sleep(0.25)
