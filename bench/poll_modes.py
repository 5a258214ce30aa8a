"""In-process measure (issue 16, not a test): how many status reads per second ONE process
achieves over 2,000 jobs in flight, chain mode vs batch mode, and the CPU each read costs.

The simulator runs in a child process (its CPU is not counted); 2,000 ``kie-standard`` jobs are
seeded accepted/processing with upstream tasks that stay ``running``. The clock is stepped, not
waited on, so the figure is capacity (what one process can do), not the demand of a 5-s interval:

* chain: the ``reconcile.poll`` messages of every job, run one after another in this process
  (``lifecycle.poll_step``, countdowns ignored: each run enqueues the job's next message).
  Celery's own cost per message (no-op tasks: 522/s on the 2-core host) comes on top;
* batch: ``batch_poll.poll_due`` over rows all due; once none is due the clock steps one poll
  interval, so every row is due again.

CPU per poll = process CPU time (``time.process_time``, every thread) / polls.

    .venv/bin/python -m bench.poll_modes [--jobs 2000] [--seconds 20] [--threads 32] [--batch 200]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
import uuid
from collections import deque
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import text

INTERVAL = timedelta(seconds=5)  # kie-standard


def _simulator(conn: Any, n: int) -> None:
    from reconcile.testing.simulator import Script, Simulator

    from .seed import sim_tasks

    sim = Simulator().start()
    sim.script_default(Script(timeline=((0.0, "queued"), (0.0, "running"), (10.0**9, "succeeded"))))
    job_ids = [uuid.uuid4() for _ in range(n)]
    tasks = sim_tasks(sim, job_ids)
    conn.send((sim.env(), [str(j) for j in job_ids], tasks))
    conn.recv()
    sim.stop()


class _Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def _runtime(url: str, env: dict[str, str], tmp: str, clock: _Clock, **settings: Any) -> Any:
    from reconcile.db.session import engine_for, make_sessionmaker
    from reconcile.runtime import Runtime
    from reconcile.settings import Settings
    from reconcile.storage import LocalStorage

    values: dict[str, Any] = {k.removeprefix("RECONCILE_").lower(): v for k, v in env.items()}
    values["media_allowed_hosts"] = json.loads(values["media_allowed_hosts"])
    values["database_url"] = url
    return Runtime(settings=Settings(**{**values, **settings}),
                   sessions=make_sessionmaker(engine_for(url)),
                   storage=LocalStorage(Path(tmp) / "media"), clock=clock)


_QUEUES: dict[int, deque[tuple[uuid.UUID, int, int]]] = {}


def _chain(rt: Any, ids: list[uuid.UUID], seconds: float) -> tuple[int, float, float]:
    """Each job's next message, in order; a second call on the same runtime carries on."""
    from reconcile import lifecycle

    queue = _QUEUES.setdefault(id(rt), deque((j, 1, 3) for j in ids))
    rt.enqueue_poll = lambda job_id, generation, seq, countdown: queue.append(
        (job_id, generation, seq))
    polls, wall0, cpu0 = 0, time.monotonic(), time.process_time()
    while queue and time.monotonic() - wall0 < seconds:
        job_id, generation, seq = queue.popleft()
        if lifecycle.poll_step(rt, job_id, generation, seq) == "in_flight":
            polls += 1
        if polls % len(ids) == 0:
            rt.clock.now += INTERVAL
    return polls, time.monotonic() - wall0, time.process_time() - cpu0


def _batch(rt: Any, seconds: float) -> tuple[int, float, float, int]:
    from reconcile.lifecycle import batch as batch_poll

    with rt.sessions.begin() as session:
        session.execute(text("UPDATE jobs SET poll_due_at = :now"), {"now": rt.clock.now})
    polls = batches = 0
    wall0, cpu0 = time.monotonic(), time.process_time()
    while time.monotonic() - wall0 < seconds:
        report = batch_poll.poll_due(rt, budget=seconds)
        polls += report.running + report.observed
        batches += report.batches
        rt.clock.now += INTERVAL  # nothing due any more: the next interval comes
    return polls, time.monotonic() - wall0, time.process_time() - cpu0, batches


def _drop_read_pools() -> None:
    """Shut the batch poller's thread pools (bench only: a profile of the reads' threads needs
    them started inside it)."""
    from reconcile.lifecycle import batch_reads

    for _, pool in list(batch_reads._POOLS.values()):
        pool.shutdown(wait=True)
    batch_reads._POOLS.clear()


def run(jobs: int = 2000, seconds: float = 20.0, threads: int = 32, batch: int = 200,
        modes: tuple[str, ...] = ("chain", "batch"), profile: str | None = None
        ) -> dict[str, Any]:
    """``profile``: a folder; each mode's loop also runs under cProfile, and its top functions
    (cumulative and self time) are written there as ``poll_<mode>.txt``. The profiled run is
    a second, shorter pass: the unprofiled figures are the ones reported."""
    from .common import throwaway_db
    from .seed import add_inflight_jobs, add_users

    parent, child = mp.Pipe()
    proc = mp.get_context("spawn").Process(target=_simulator, args=(child, jobs), daemon=True)
    proc.start()
    env, job_ids, tasks = parent.recv()
    ids = [uuid.UUID(j) for j in job_ids]
    result: dict[str, Any] = {"jobs": jobs, "seconds": seconds, "threads": threads,
                              "batch_size": batch}
    try:
        for mode in modes:
            with throwaway_db(f"pollmodes_{mode}") as (url, _), \
                    tempfile.TemporaryDirectory() as tmp:
                start = datetime.now(UTC)
                clock = _Clock(start + INTERVAL)
                rt = _runtime(url, env, tmp, clock, poll_mode=mode, poll_batch_threads=threads,
                              poll_batch_size=batch)
                users = [uuid.uuid4() for _ in range(100)]
                with rt.sessions.begin() as session:
                    conn = session.connection()
                    add_users(conn, users)
                    add_inflight_jobs(conn, [(j, users[i % 100], t) for i, (j, t) in
                                             enumerate(zip(ids, tasks, strict=True))],
                                      kind="kie-standard", model="m", started=start,
                                      lease=start + timedelta(minutes=10))
                if mode == "chain":
                    polls, wall, cpu = _chain(rt, ids, seconds)
                    extra: dict[str, Any] = {}
                else:
                    polls, wall, cpu, batches = _batch(rt, seconds)
                    extra = {"batches": batches}
                result[mode] = {"polls": polls, "wall_s": round(wall, 2),
                                "polls_per_s": round(polls / wall, 1),
                                "cpu_ms_per_poll": round(1000 * cpu / max(polls, 1), 3), **extra}
                print(mode, result[mode], flush=True)
                if profile:
                    from .profiles import profiled

                    def again(mode: str = mode, rt: Any = rt) -> int:
                        if mode == "chain":
                            return _chain(rt, ids, seconds / 2)[0]
                        _drop_read_pools()  # the reads' threads start (profiled) inside
                        try:
                            return _batch(rt, seconds / 2)[0]
                        finally:
                            _drop_read_pools()  # ...and end before the profile is read

                    result[mode]["profile"] = profiled(
                        again, Path(profile) / f"poll_{mode}.txt",
                        f"in-process {mode} polls, {jobs} kie-standard jobs in flight "
                        f"(bench.poll_modes)", unit="poll", threads=mode == "batch")
    finally:
        parent.send("stop")
        proc.join(timeout=10)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--modes", default="chain,batch")
    parser.add_argument("--profile", default=None, help="folder for cProfile summaries")
    args = parser.parse_args()
    print(json.dumps(run(args.jobs, args.seconds, args.threads, args.batch,
                         tuple(args.modes.split(",")), args.profile), indent=2))


if __name__ == "__main__":
    main()
