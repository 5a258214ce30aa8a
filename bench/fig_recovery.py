"""Figure 6 — recovery after SIGKILL of a whole worker mid-poll: seconds until polling resumes.

Time-scaled (``RECONCILE_TIME_SCALE`` = ``SCALE``): every interval, lease and the beat schedule
shrink by it; figures are given in real seconds and scaled back (real ÷ SCALE, the
production-equivalent). Per sweep interval (the default 300 s, and 30 s):

* a survivor worker B (prefork -c 2) and one ``celery beat`` (the library's schedule) run
  throughout; the broker's visibility timeout stays 3600 s, so only the sweep can recover;
* each round seeds ``JOBS`` fresh accepted ``kie-standard`` jobs and starts their poll chains;
  a victim worker A (-c 2) starts with the crash hook armed later
  (``RECONCILE_TEST_CRASH_AT=mid_poll``, ``…_MODE=group``, ``…_ONCE=<marker>``: the marker
  exists, so nothing happens until the bench deletes it after a random delay — a random phase
  against the beat). A's next poll SIGKILLs A's main process and children. The kill time is
  the marker's creation time;
* a sampler reads every job's (poll_generation, poll_seq) every 20 ms. The jobs whose chains
  died with A are those that never progress again in their generation; polling has resumed for
  one when a poll of a newer generation has run (seq ≥ 1). Latency = that − kill.
* the jobs of one round share one tick phase, so besides the measured percentiles a model
  resamples the measured parts (lease left at the kill, dispatch after the tick) with a uniform
  tick phase.

The backstop is measured here: the heartbeat is off (``RECONCILE_HEARTBEAT_INTERVAL=0``), since
its timings are real seconds and would not scale with the rest; figure 9 measures the heartbeat
at the default settings.

Expected shape: the poll lease still running at the kill (``lifecycle.poll_lease``: 2 × interval
+ ``POLL_LEASE_SLACK``, renewed at each poll) plus the wait for the next sweep tick after it expires, plus dispatch.
"""

from __future__ import annotations

import os
import random
import tempfile
import threading
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
from .seed import add_inflight_jobs, add_users, sim_tasks, spread

SCALE = 0.1
JOBS = 12
INTERVAL = 5.0  # kie-standard poll interval (s)
LEASE = poll_lease_seconds("kie-standard")  # lifecycle.poll_lease, imported (production s)
# sweep interval, rounds: 4 rounds of the 30 s interval (≈ 17 s each here; 6 until `make
# bench` ran 913 s, over its 15 minutes, under load); the model resamples their parts
CONFIGS = {"default_300s": (300.0, 2), "30s": (30.0, 4)}


class Sampler(threading.Thread):
    """Polls (generation, seq) of the current round's jobs; keeps every change with its time."""

    def __init__(self, engine: Any) -> None:
        super().__init__(daemon=True)
        self.engine = engine
        self.ids: list[str] = []
        self.history: dict[str, list[tuple[float, int, int]]] = {}
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def track(self, ids: list[uuid.UUID]) -> None:
        with self.lock:
            self.ids = [str(i) for i in ids]
            self.history = {i: [] for i in self.ids}

    def run(self) -> None:
        with self.engine.connect() as conn:
            while not self.stop.is_set():
                with self.lock:
                    ids = list(self.ids)
                if ids:
                    rows = conn.execute(text(
                        "SELECT id, poll_generation, poll_seq FROM jobs "
                        "WHERE id = ANY(CAST(:ids AS uuid[]))"), {"ids": ids}).all()
                    conn.rollback()
                    now = time.time()
                    with self.lock:
                        for r in rows:
                            h = self.history.get(str(r.id))
                            if h is not None and (not h or h[-1][1:] != (r.poll_generation, r.poll_seq)):
                                h.append((now, r.poll_generation, r.poll_seq))
                time.sleep(0.02)

    def snapshot(self) -> dict[str, list[tuple[float, int, int]]]:
        with self.lock:
            return {k: list(v) for k, v in self.history.items()}


def _state_at(h: list[tuple[float, int, int]], t: float) -> tuple[int, int] | None:
    state = None
    for at, g, s in h:
        if at > t:
            break
        state = (g, s)
    return state


def _latencies(history: dict[str, list[tuple[float, int, int]]], kill: float,
               lease_real: float, horizon: float) -> tuple[list[dict[str, float]], int]:
    """Per job whose chain died with the kill: latency (kill → first poll of a newer
    generation), and its parts: ``lease_left`` (kill → lease expiry: last poll before the kill
    + lease), ``tick_wait`` (expiry → the sweep's new generation seen) and ``dispatch`` (→ that
    poll ran). A chain that still progresses in its old generation after the kill lived on the
    survivor (however late) and is not counted. Also returns the unresolved count."""
    out, unresolved = [], 0
    for h in history.values():
        before = [e for e in h if e[0] <= kill]
        if not before:
            continue
        last_poll, gen, _ = before[-1]
        after = [e for e in h if kill < e[0] <= kill + horizon]
        if any(e[1] == gen for e in after):
            continue  # its chain lived on (on the survivor)
        newer = [e for e in after if e[1] > gen]
        resumed = [e for e in newer if e[2] >= 1]
        if not resumed:
            unresolved += 1
            continue
        bump = newer[0][0]  # the sweep's claim (seq 0), or the poll itself if seq 0 was missed
        expiry = last_poll + lease_real
        out.append({"latency": resumed[0][0] - kill, "lease_left": expiry - kill,
                    "tick_wait": bump - expiry, "dispatch": resumed[0][0] - bump})
    return out, unresolved


def _model(parts: list[dict[str, float]], interval_real: float, draws: int = 20000) -> list[float]:
    """Latency = lease_left + U(0, sweep interval) + dispatch, resampling the measured
    (lease_left, dispatch) pairs: the tick phase is uniform whatever the round gave."""
    rng = random.Random(1)
    return [p["lease_left"] + rng.uniform(0.0, interval_real) + p["dispatch"]
            for p in (rng.choice(parts) for _ in range(draws))]


def _one_config(name: str, interval: float, rounds: int, quick: bool) -> dict[str, Any]:
    from reconcile.db.session import make_engine
    from reconcile.testing.simulator import Script, Simulator

    purge_broker()
    sweep_real = interval * SCALE
    lease_real = LEASE * SCALE
    out: dict[str, Any] = {"sweep_interval_s": interval, "time_scale": SCALE,
                           "sweep_interval_real_s": sweep_real,
                           "poll_lease_s": LEASE, "poll_lease_real_s": lease_real,
                           "rounds": []}
    with throwaway_db("recovery") as (url, _), tempfile.TemporaryDirectory() as tmp, \
            Simulator() as sim:
        tmpd = Path(tmp)
        # generations far longer than a round: nothing completes while we watch
        sim.script_default(Script(timeline=((0.0, "queued"), (0.1, "running"),
                                             (3600.0, "succeeded"))))
        engine = make_engine(url)
        users = [uuid.uuid4() for _ in range(10)]
        with engine.begin() as conn:
            add_users(conn, users)
        base = worker_env(url, sim.env(), tmpd / "media", time_scale=SCALE,
                          RECONCILE_SWEEP_INTERVAL=repr(interval),
                          RECONCILE_BROKER_VISIBILITY_TIMEOUT="3600",
                          RECONCILE_HEARTBEAT_INTERVAL="0")
        survivor = Proc.worker(base, tmpd / "survivor.log", concurrency=2)
        beat = Proc.beat(base, tmpd / "beat.log", tmpd / "beat-schedule")
        sampler = Sampler(engine)
        sampler.start()
        sender = make_sender()
        def spawn_victim(r: int) -> Any:
            marker = tmpd / f"crashed-{r}"
            marker.touch()  # present: the crash hook stays quiet until we delete it
            return marker, Proc.worker({**base, "RECONCILE_TEST_CRASH_AT": "mid_poll",
                                        "RECONCILE_TEST_CRASH_MODE": "group",
                                        "RECONCILE_TEST_CRASH_ONCE": str(marker)},
                                       tmpd / f"victim-{r}.log", concurrency=2)

        pending: Any = None
        try:
            survivor.wait_ready()
            for r in range(rounds):
                # the next round's victim boots while this round waits out its horizon (it
                # serves resumed polls like the survivor meanwhile; its hook stays quiet)
                marker, victim = pending if pending is not None else spawn_victim(r)
                pending = None
                try:
                    victim.wait_ready()
                    ids = [uuid.uuid4() for _ in range(JOBS)]
                    tasks = sim_tasks(sim, ids)
                    now = datetime.now(UTC)
                    with engine.begin() as conn:
                        add_inflight_jobs(conn, spread(ids, users, tasks),
                                          kind="kie-standard", model="m", started=now,
                                          lease=now + timedelta(seconds=lease_real))
                    sampler.track(ids)
                    for j in ids:
                        sender.send_task("reconcile.poll", args=[str(j), 1, 3])
                    time.sleep(1.0 + random.uniform(0.0, sweep_real))  # spread, random phase
                    marker.unlink()
                    if not wait_until(marker.exists, 30, interval=0.01):
                        raise RuntimeError("the victim never reached mid_poll")
                    kill = os.stat(marker).st_mtime
                    wait_until(lambda v=victim: not v.alive(), 10, interval=0.05)
                    horizon = lease_real + sweep_real + 8.0  # dispatch on a loaded host
                    if r + 1 < rounds:
                        pending = spawn_victim(r + 1)
                    time.sleep(max(0.0, kill + horizon - time.time()))
                    parts, unresolved = _latencies(sampler.snapshot(), kill, lease_real, horizon)
                    lat = [p["latency"] for p in parts]
                finally:
                    victim.stop()
                with engine.begin() as conn:  # retire this round's chains (they fence out)
                    conn.execute(text("UPDATE jobs SET status = 'completed' "
                                      "WHERE id = ANY(CAST(:ids AS uuid[]))"),
                                 {"ids": [str(j) for j in ids]})
                out["rounds"].append({"affected": len(lat) + unresolved, "unresolved": unresolved,
                                      "latencies_real_s": [round(x, 3) for x in lat],
                                      "parts_real_s": [{k: round(v, 3) for k, v in p.items()}
                                                       for p in parts]})
                log(f"fig6 [{name}] round {r + 1}/{rounds}: {len(lat)} chains resumed, "
                    f"max {max(lat) if lat else float('nan'):.2f}s real, unresolved {unresolved}")
            sweeps = survivor.text().count("[reconcile] scanned=")
        finally:
            if pending is not None:
                pending[1].stop()
            sampler.stop.set()
            sampler.join(timeout=5)
            beat.stop()
            survivor.stop()
            engine.dispose()
    real = [x for rd in out["rounds"] for x in rd["latencies_real_s"]]
    parts = [p for rd in out["rounds"] for p in rd["parts_real_s"]]
    out["samples"] = len(real)
    out["unresolved"] = sum(rd["unresolved"] for rd in out["rounds"])
    out["measured_real_s"] = summary(real, 3)
    out["measured_scaled_s"] = summary([x / SCALE for x in real], 1)
    # production-equivalent of each measured latency: the lease and the tick wait scale, the
    # dispatch (sweep claim → the resumed poll ran: real queueing and task overhead) does not
    parts_all = [p for rd in out["rounds"] for p in rd["parts_real_s"]]
    out["measured_production_s"] = summary(
        [(p["latency"] - p["dispatch"]) / SCALE + p["dispatch"] for p in parts_all], 1)
    if parts:
        out["parts_scaled_s_p50"] = {k: round(sorted(p[k] for p in parts)[len(parts) // 2] / SCALE, 1)
                                     for k in ("lease_left", "tick_wait", "dispatch")}
        out["model_scaled_s"] = summary([x / SCALE for x in _model(parts, sweep_real)], 1)
        # production-equivalent: the lease and the tick phase scale with time, the dispatch
        # (sweep task → claim → poll message → poll run) is real overhead and does not
        unscaled = [{"lease_left": p["lease_left"] / SCALE, "dispatch": p["dispatch"]}
                    for p in parts]
        out["model_production_s"] = summary(_model(unscaled, interval), 1)
        out["dispatch_real_s_p50"] = round(sorted(p["dispatch"] for p in parts)[len(parts) // 2], 3)
        out["model_note"] = ("measured lease_left and dispatch per job, resampled, plus a uniform "
                             "wait for the next tick (every round gives only one tick phase); "
                             "model_production_s keeps the dispatch in real seconds")
    out["expected_scaled_s"] = {
        "min": round(LEASE - INTERVAL, 1), "max": round(LEASE + interval, 1),
        "note": "lease left at the kill (lease - up to one poll interval .. lease) + up to one "
                "sweep interval, before dispatch overheads"}
    out["sweep_ticks_seen_by_survivor"] = sweeps
    return out


def _modelled_only(name: str, interval: float, measured: dict[str, Any]) -> dict[str, Any]:
    """A sweep interval not run: the model from another config's measured parts (the lease
    left at the kill and the dispatch do not depend on the sweep interval; the tick wait is
    the model's uniform draw over this interval)."""
    out: dict[str, Any] = {"sweep_interval_s": interval, "time_scale": SCALE,
                           "sweep_interval_real_s": interval * SCALE, "poll_lease_s": LEASE,
                           "poll_lease_real_s": LEASE * SCALE, "rounds": [], "samples": 0,
                           "unresolved": 0, "measured_real_s": {"n": 0},
                           "measured_scaled_s": {"n": 0}, "measured_production_s": {"n": 0},
                           "modelled_only": True}
    parts = [p for rd in measured["rounds"] for p in rd["parts_real_s"]]
    if parts:
        out["model_scaled_s"] = summary([x / SCALE for x in _model(parts, interval * SCALE)], 1)
        out["model_production_s"] = summary(_model(
            [{"lease_left": p["lease_left"] / SCALE, "dispatch": p["dispatch"]} for p in parts],
            interval), 1)
    out["model_note"] = (f"not run (`make bench-full` runs it): modelled from the "
                         f"{measured['sweep_interval_s']:.0f} s config's measured lease left "
                         "and dispatch, with a uniform tick wait over this interval")
    out["expected_scaled_s"] = {"min": round(LEASE - INTERVAL, 1), "max": round(LEASE + interval, 1)}
    return out


def run(quick: bool = False, full: bool = False) -> dict[str, Any]:
    """The 30 s sweep interval (the aim) is measured; the default 300 s one only with ``full``
    (each of its rounds waits out a 30-s real tick), else modelled from the 30 s parts."""
    result: dict[str, Any] = {"time_scale": SCALE, "jobs_per_round": JOBS,
                              "kind": "kie-standard", "configs": {}}
    for name in ("30s", "default_300s"):
        interval, rounds = CONFIGS[name]
        if name == "default_300s" and not full:
            result["configs"][name] = _modelled_only(name, interval, result["configs"]["30s"])
            continue
        result["configs"][name] = _one_config(name, interval, 2 if quick else rounds, quick)
        c = result["configs"][name]
        log(f"fig6 [{name}]: measured p50 {c['measured_scaled_s'].get('p50')} s p99 "
            f"{c['measured_scaled_s'].get('p99')} s scaled ({c['samples']} samples); model p50 "
            f"{c.get('model_scaled_s', {}).get('p50')} p99 {c.get('model_scaled_s', {}).get('p99')}")
    result["target"] = "p99 <= 60 s at a 30 s sweep interval"
    return result
