"""Figure 8 — recovery after SIGKILL of every worker mid-poll, at the default settings: worker
heartbeats, real time (``TIME_SCALE`` 1), no beat (so no sweep tick can help).

``JOBS`` accepted ``kie-standard`` chains (5 s interval, 25 s poll lease) run on the only
worker (prefork -c 2). Its crash hook (``mid_poll``, whole process group) is armed once every
chain took a turn there; at the kill every chain's next message dies with the worker (the
broker's visibility timeout is 3600 s) and a new worker is started at once, as a supervisor
would. The new worker's heartbeat notices the dead processes (``HEARTBEAT_TIMEOUT`` 6 s after
their last beat, checked every ``HEARTBEAT_INTERVAL`` 2 s), ends their poll turns and resumes
each chain under a new generation. Latency per job = kill → the first poll of a newer
generation (the sampler of figure 6). Figure 6 measures the backstop (the lease and the sweep)
with the heartbeat off.
"""

from __future__ import annotations

import os
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
LEASE = poll_lease_seconds("kie-standard")


def run(quick: bool = False) -> dict[str, Any]:
    from reconcile.db.session import make_engine
    from reconcile.settings import Settings
    from reconcile.testing.simulator import Script, Simulator

    jobs = 40 if quick else JOBS
    defaults = Settings()
    purge_broker()
    out: dict[str, Any] = {"jobs": jobs, "time_scale": 1.0, "poll_lease_s": LEASE,
                           "heartbeat_interval_s": defaults.heartbeat_interval,
                           "heartbeat_timeout_s": defaults.heartbeat_timeout,
                           "sweep": "none (no beat)"}
    with throwaway_db("heartbeat") as (url, _), tempfile.TemporaryDirectory() as tmp, \
            Simulator() as sim:
        tmpd = Path(tmp)
        sim.script_default(Script(timeline=((0.0, "queued"), (0.1, "running"),
                                             (3600.0, "succeeded"))))
        engine = make_engine(url)
        users = [uuid.uuid4() for _ in range(20)]
        with engine.begin() as conn:
            add_users(conn, users)
        base = worker_env(url, sim.env(), tmpd / "media",
                          RECONCILE_BROKER_VISIBILITY_TIMEOUT="3600")
        marker = tmpd / "crashed"
        marker.touch()  # present: the hook stays quiet until the bench deletes it
        victim = Proc.worker({**base, "RECONCILE_TEST_CRASH_AT": "mid_poll",
                              "RECONCILE_TEST_CRASH_MODE": "group",
                              "RECONCILE_TEST_CRASH_ONCE": str(marker)},
                             tmpd / "victim.log", concurrency=2)
        restarted: Any = None
        sampler = Sampler(engine)
        sampler.start()
        try:
            victim.wait_ready()
            ids = [uuid.uuid4() for _ in range(jobs)]
            tasks = sim_tasks(sim, ids)
            now = datetime.now(UTC)
            with engine.begin() as conn:
                add_inflight_jobs(conn, spread(ids, users, tasks),
                                  kind="kie-standard", model="m", started=now,
                                  lease=now + timedelta(seconds=LEASE))
            sampler.track(ids)
            sender = make_sender()
            for j in ids:
                sender.send_task("reconcile.poll", args=[str(j), 1, 3])

            def all_turned() -> bool:
                with engine.connect() as conn:
                    return conn.execute(text(
                        "SELECT count(*) FROM jobs WHERE id = ANY(CAST(:ids AS uuid[])) "
                        "AND claimed_by IS NOT NULL"), {"ids": [str(j) for j in ids]}
                    ).scalar_one() == len(ids)

            wait_until(all_turned, 60, interval=0.2)
            marker.unlink()
            if not wait_until(marker.exists, 30, interval=0.01):
                raise RuntimeError("the victim never reached mid_poll")
            kill = os.stat(marker).st_mtime
            restarted = Proc.worker(base, tmpd / "restarted.log", concurrency=2)
            wait_until(lambda: not victim.alive(), 10, interval=0.05)
            restarted.wait_ready()
            ready = time.time() - kill
            horizon = 60.0
            time.sleep(max(0.0, kill + horizon - time.time()))
            parts, unresolved = _latencies(sampler.snapshot(), kill, LEASE, horizon)
            latencies = [p["latency"] for p in parts]
            reaped = restarted.text().count("worker_lapsed")
            reaper_log = [line for line in restarted.text().splitlines()
                          if any(w in line for w in ("worker_lapsed", "reap workers=",
                                                     "heartbeat_started", "ready."))]
        finally:
            sampler.stop.set()
            sampler.join(timeout=5)
            victim.stop()
            if restarted is not None:
                restarted.stop()
            engine.dispose()
    out.update({"mode": "chain",  # the victim dies at the chain's mid_poll (worker_env)
                "affected": len(latencies) + unresolved, "unresolved": unresolved,
                "restarted_ready_after_kill_s": round(ready, 2),
                "reaps_logged": reaped, "reaper_log": reaper_log[-12:],
                "kill_at": kill, "recovery_s": summary(latencies, 2),
                "latencies_s": [round(x, 3) for x in latencies]})
    log(f"fig9: {len(latencies)} chains resumed, p50 {out['recovery_s'].get('p50')} s p99 "
        f"{out['recovery_s'].get('p99')} s after the kill (restarted worker ready after "
        f"{ready:.1f} s), unresolved {unresolved}")
    return out
