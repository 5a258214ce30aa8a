"""Recovery after a broker wipe (issue 18): seconds until every poll chain runs again.

``python -m bench.fig_broker_wipe`` (reported, never asserted; ≈ 3 min). Time-scaled like figure
6 (``SCALE``): intervals, leases and the beat schedule shrink by it; figures are real seconds and
their production equivalent (real ÷ SCALE, dispatch overhead included, so slightly pessimistic).

Per sweep interval (the default 300 s, and 30 s): a scratch ``redis-server`` (no persistence),
one worker (prefork -c 2) and one ``celery beat`` with the library's schedule; ``JOBS`` accepted
``kie-standard`` jobs poll (their upstream tasks never finish). Then Redis is SIGKILLed and
restarted EMPTY: every queued, unacked and ETA message is gone (held ETA polls the worker still
runs may carry on). A sampler reads each job's (poll_generation, poll_seq); a job has recovered
when a poll ran after the restart. The worker must still be alive at the end.

Expected: a chain whose messages were lost waits out its poll lease (2 × interval + slack + the
poll step's total deadline, renewed at each poll), then up to one sweep interval for the tick
that resumes it.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

from .common import Proc, log, make_sender, summary, throwaway_db, worker_env
from .seed import add_inflight_jobs, add_users, sim_tasks, spread

SCALE = 0.05
JOBS = 12
CONFIGS = {"default_300s": 300.0, "30s": 30.0}


def _lease_s() -> float:
    """lifecycle.poll_lease for kie-standard at the default settings (production seconds)."""
    from .common import poll_lease_seconds

    return poll_lease_seconds("kie-standard")


def _states(engine: Any, ids: list[uuid.UUID]) -> dict[str, tuple[int, int]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, poll_generation, poll_seq FROM jobs "
                                 "WHERE id = ANY(CAST(:ids AS uuid[]))"),
                            {"ids": [str(j) for j in ids]}).all()
    return {str(r[0]): (int(r[1]), int(r[2])) for r in rows}


def _one(name: str, interval: float) -> dict[str, Any]:
    from reconcile.db.session import make_engine
    from reconcile.testing.processes import ScratchRedis
    from reconcile.testing.simulator import Script, Simulator

    lease_real = _lease_s() * SCALE
    sweep_real = interval * SCALE
    with throwaway_db("wipe") as (url, _), tempfile.TemporaryDirectory() as tmp, \
            Simulator() as sim:
        tmpd = Path(tmp)
        sim.script_default(Script(timeline=((0.0, "queued"), (0.1, "running"),
                                             (36000.0, "succeeded"))))
        redis = ScratchRedis(log_path=tmpd / "redis.log").start()
        engine = make_engine(url)
        users = [uuid.uuid4() for _ in range(4)]
        with engine.begin() as conn:
            add_users(conn, users)
        base = worker_env(url, sim.env(), tmpd / "media", time_scale=SCALE,
                          RECONCILE_BROKER_URL=redis.url(0),
                          RECONCILE_SWEEP_INTERVAL=repr(interval))
        worker = Proc.worker(base, tmpd / "worker.log", concurrency=2)
        beat = Proc.beat(base, tmpd / "beat.log", tmpd / "beat-schedule")
        try:
            worker.wait_ready()
            ids = [uuid.uuid4() for _ in range(JOBS)]
            tasks = sim_tasks(sim, ids)
            now = datetime.now(UTC)
            with engine.begin() as conn:
                add_inflight_jobs(conn, spread(ids, users, tasks),
                                  kind="kie-standard", model="m", started=now,
                                  lease=now + timedelta(seconds=lease_real))
            sender = make_sender(redis.url(0))
            for j in ids:
                sender.send_task("reconcile.poll", args=[str(j), 1, 3])
            time.sleep(3.0)  # every chain polling, countdown polls held by the worker
            redis.kill()
            time.sleep(1.0)
            redis.start()  # empty
            wiped = time.monotonic()
            before = _states(engine, ids)
            recovered: dict[str, float] = {}
            horizon = lease_real + sweep_real + 15.0
            stop = threading.Event()
            while time.monotonic() - wiped < horizon and len(recovered) < len(ids):
                for job, state in _states(engine, ids).items():
                    if job not in recovered and state != before[job]:
                        recovered[job] = time.monotonic() - wiped
                stop.wait(0.05)
            resumed = sum(1 for job, (gen, _) in _states(engine, ids).items()
                          if gen > before[job][0])
            real = sorted(recovered.values())
            out = {"sweep_interval_s": interval, "time_scale": SCALE,
                   "poll_lease_s": round(_lease_s(), 1), "jobs": len(ids),
                   "recovered": len(real), "resumed_by_sweep": resumed,
                   "worker_alive": worker.proc.poll() is None,
                   "real_s": summary(real, 2),
                   "production_s": summary([x / SCALE for x in real], 0)}
            log(f"broker wipe [{name}]: {json.dumps(out)}")
            return out
        finally:
            beat.stop()
            worker.stop()
            redis.stop()
            engine.dispose()


def run() -> dict[str, Any]:
    return {name: _one(name, interval) for name, interval in CONFIGS.items()}


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
    sys.exit(0)
