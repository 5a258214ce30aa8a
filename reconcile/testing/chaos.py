"""A seeded chaos run: N jobs through real Celery workers, with faults, checked against invariants.

Deterministic simulation testing, as far as real processes allow: the seed derives every job (id,
kind, script, price, submit time) and the whole fault schedule (which worker is SIGKILLed when,
when the scratch Redis restarts, when PostgreSQL backends are terminated, the simulator's chaos
knobs). The same seed replays the same schedule; only timing noise differs. Run it::

    python -m reconcile.testing.chaos --jobs 300 [--seed S]      # or: make chaos N=300

What runs: a fresh PostgreSQL database, a ``redis-server`` this harness starts on a free port (the
broker and the events pub/sub; no persistence, so a restart loses every queued message), the
provider simulator with random latency and failures, a webhook receiver, two ``celery worker``
processes, the platform side in this process (submitting jobs, running the sync kinds' calls) and
two sweepers ticking on overlapping schedules. At the end, with the faults over and the system
given time to settle, the invariants are checked:

* no worker exited unless the schedule killed it, and no live worker stopped consuming (no task
  received for ``STALL_SECONDS`` while messages waited): checked while the run goes on;
* no job was created upstream twice; no job was settled twice; the ledger audit is clean;
* every job is terminal and settled, except ``uncertain`` ones (listed: never auto-refunded);
* every asset row's object exists; a completed job has exactly one asset row per output (and only
  after its upstream task succeeded); every outbox event was published;
* storage objects no asset row names (orphans) are counted and reported, not a violation.

The report goes to stdout; the exit status is 1 on any violation. The processes it drives come
from :mod:`reconcile.testing.processes`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from .processes import CeleryWorker, ScratchRedis, WebhookReceiver, celery_sender, enqueuers

log = logging.getLogger("reconcile.chaos")

PG_ADMIN_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"

# --------------------------------------------------------------------------- the seeded plan

# (kind, model, input) per provider family; a sync kind is run by the platform's request
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "kie-standard": ("seedream/4.5-edit", {"prompt": "a cat"}),
    "kie-veo": ("veo3_fast", {"prompt": "a dog"}),
    "replicate-prediction": ("owner/model:abc123", {"prompt": "x"}),
    "elevenlabs-async": ("dubbing", {"source_url": "https://example.com/a.mp4",
                                     "target_lang": "es"}),
    "fal-queue": ("fal-ai/flux/dev", {"prompt": "x"}),
    "anthropic-sync": ("claude-sonnet-4-5", {"prompt": "hi"}),
    "kie-llm": ("gpt-5", {"messages": [{"role": "user", "content": "hi"}]}),
    "elevenlabs-sync": ("tts:voice1", {"text": "hi"}),
}
SYNC_KINDS = ("anthropic-sync", "kie-llm", "elevenlabs-sync")
ASYNC_WEIGHTS = {"kie-standard": 3, "kie-veo": 2, "replicate-prediction": 3,
                 "elevenlabs-async": 1, "fal-queue": 3}


@dataclass(frozen=True)
class JobSpec:
    index: int
    job_id: str
    kind: str
    user: int
    credits: int
    submit_at: float  # seconds after the start
    script: dict[str, Any]  # Script fields (sync kinds: create mode only)


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the start
    action: str  # kill_worker | redis_restart | pg_terminate
    target: int = 0  # the worker index (kill_worker)
    down_for: float = 0.0  # seconds until the restart (kill_worker, redis_restart)


@dataclass(frozen=True)
class Plan:
    seed: int
    window: float  # seconds over which jobs are submitted and faults happen
    jobs: tuple[JobSpec, ...]
    faults: tuple[Fault, ...]
    sim_knobs: dict[str, Any]
    sweep_intervals: tuple[float, float]
    users: int

    def digest(self) -> str:
        """A short fingerprint: the same seed (and N) always prints the same one."""
        import hashlib

        text = json.dumps([asdict(j) for j in self.jobs] + [asdict(f) for f in self.faults]
                          + [self.sim_knobs, list(self.sweep_intervals)], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _script(rng: random.Random, kind: str) -> dict[str, Any]:
    """One upstream behaviour: mostly success, some failures, odd states, 429s, lost answers.

    A sync call carries no job id upstream, so sync kinds follow the simulator's default script
    (their failures come from its ``fail_rate``)."""
    if kind in SYNC_KINDS:
        return {}
    start = round(rng.uniform(0.05, 0.6), 3)
    done = round(start + rng.uniform(0.2, 2.5), 3)
    end = rng.choices(["succeeded", "failed", "canceled", "empty"], [78, 15, 3, 4])[0]
    outputs = 0 if end == "empty" else rng.randint(1, 3)
    timeline: list[tuple[float, str]] = [(0.0, "queued"), (start, "running")]
    if rng.random() < 0.05:  # a status the adapters do not know, then a real ending
        timeline.append((round((start + done) / 2, 3), "unknown:mystery"))
    timeline.append((done, "succeeded" if end == "empty" else end))
    create = rng.choices(["accept", "rate_limit", "reject_invalid", "reject_auth",
                          "server_error", "drop_after_accept", "garbage_2xx"],
                         [84, 5, 2, 1, 2, 4, 2])[0]
    return {"timeline": timeline, "outputs": outputs, "create": create,
            "rate_limit_times": rng.randint(1, 2) if create == "rate_limit" else None,
            "retry_after": 1.0, "webhook": rng.random() < 0.5,
            "kie_msg_key": rng.choice(["msg", "message"])}


def make_plan(seed: int, jobs: int, *, rate: float = 12.0, workers: int = 2) -> Plan:
    """Everything the seed decides, in one deterministic pass of one ``random.Random(seed)``."""
    rng = random.Random(seed)
    window = max(8.0, jobs / rate)
    users = max(3, jobs // 50)
    kinds = list(ASYNC_WEIGHTS) + list(SYNC_KINDS)
    weights = list(ASYNC_WEIGHTS.values()) + [1] * len(SYNC_KINDS)
    specs = []
    for index in range(jobs):
        kind = rng.choices(kinds, weights)[0]
        specs.append(JobSpec(
            index=index, job_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)), kind=kind,
            user=rng.randrange(users), credits=rng.randint(1, 60),
            submit_at=round(rng.uniform(0.0, window), 3), script=_script(rng, kind)))
    specs.sort(key=lambda s: (s.submit_at, s.index))
    faults: list[Fault] = []
    kills = max(2, round(jobs / 150))
    for n in range(kills):  # each worker is killed at least once
        faults.append(Fault(round(rng.uniform(0.1, 0.9) * window, 3), "kill_worker",
                            target=n % workers, down_for=round(rng.uniform(0.2, 2.0), 3)))
    for _ in range(1 + jobs // 2500):  # down for seconds, as a real restart: a worker must
        # ride out a broker that stays away while it holds unacked messages (issue 18)
        faults.append(Fault(round(rng.uniform(0.3, 0.8) * window, 3), "redis_restart",
                            down_for=round(rng.uniform(2.0, 5.0), 3)))
    for _ in range(2 + jobs // 200):
        faults.append(Fault(round(rng.uniform(0.05, 0.95) * window, 3), "pg_terminate"))
    faults.sort(key=lambda f: (f.at, f.action, f.target))
    knobs = {"fail_rate": round(rng.uniform(0.0, 0.02), 4),
             "read_fail_rate": round(rng.uniform(0.02, 0.08), 4),
             "latency_range": (0.0, round(rng.uniform(0.005, 0.05), 4))}
    sweeps = (round(rng.uniform(0.4, 1.2), 3), round(rng.uniform(0.4, 1.2), 3))
    return Plan(seed, window, tuple(specs), tuple(faults), knobs, sweeps, users)


# --------------------------------------------------------------------------- the run


@dataclass
class ChaosConfig:
    jobs: int = 300
    seed: int | None = None
    workers: int = 2
    concurrency: int = 2
    time_scale: float = 0.05
    rate: float = 12.0  # jobs submitted per second
    settle_timeout: float | None = None  # seconds after the window (None: from N)
    pg_admin: str = PG_ADMIN_DEFAULT
    workdir: str | None = None
    keep: bool = False
    quiet: bool = False


@dataclass
class ChaosReport:
    seed: int
    plan_digest: str
    jobs: int
    by_kind: dict[str, int]
    kills: int
    worker_restarts: int
    unplanned_worker_exits: int
    redis_restarts: int
    pg_terminations: int
    submit_failed: int
    pg_backends_terminated: int
    sweeps: int
    sweep_errors: int
    recovered: int
    completed: int
    failed: int
    refunded: int
    uncertain: list[str]
    orphans: int
    lost_publishes: int
    webhook_answers: dict[str, int]
    violations: list[str]
    seconds: float
    throughput: float  # jobs settled per second of the whole run
    outcomes: dict[str, int] = field(default_factory=dict)

    def ok(self) -> bool:
        return not self.violations

    def _uncertain_groups(self) -> list[tuple[str, list[str]]]:
        groups: dict[str, list[str]] = {}
        for entry in self.uncertain:  # "<job id> (<kind>, <created upstream|never created>)"
            job_id, _, rest = entry.partition(" ")
            groups.setdefault(rest.strip("()"), []).append(job_id)
        return sorted(groups.items())

    def text(self) -> str:
        lines = [
            f"chaos seed={self.seed} plan={self.plan_digest} jobs={self.jobs} "
            f"({', '.join(f'{k}={v}' for k, v in sorted(self.by_kind.items()))})",
            f"  faults: kills={self.kills} worker_restarts={self.worker_restarts} "
            f"unplanned_worker_exits={self.unplanned_worker_exits} "
            f"redis_restarts={self.redis_restarts} pg_terminations={self.pg_terminations} "
            f"(backends terminated={self.pg_backends_terminated}) "
            f"lost_publishes={self.lost_publishes} submit_failed={self.submit_failed}",
            f"  sweeps={self.sweeps} sweep_errors={self.sweep_errors} "
            f"webhooks={dict(sorted(self.webhook_answers.items()))}",
            f"  outcomes: completed={self.completed} failed={self.failed} "
            f"recovered={self.recovered} refunded={self.refunded} "
            f"uncertain={len(self.uncertain)} orphans={self.orphans}",
            f"  by code: {dict(sorted(self.outcomes.items()))}",
            f"  uncertain (never refunded automatically; reservation kept for an operator): "
            f"{len(self.uncertain)}{':' if self.uncertain else ''}",
            *[f"    {group}: {', '.join(ids)}" for group, ids in self._uncertain_groups()],
            f"  time={self.seconds:.1f}s throughput={self.throughput:.1f} jobs/s",
            f"  invariant violations: {len(self.violations)}",
        ]
        lines += [f"    - {v}" for v in self.violations[:50]]
        if len(self.violations) > 50:
            lines.append(f"    … and {len(self.violations) - 50} more")
        lines.append(f"  replay: python -m reconcile.testing.chaos --jobs {self.jobs} "
                     f"--seed {self.seed}")
        return "\n".join(lines)


class _Run:
    """One chaos run's moving parts (see :func:`run`)."""

    def __init__(self, config: ChaosConfig, plan: Plan, workdir: Path) -> None:
        self.config, self.plan, self.workdir = config, plan, workdir
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.recovered_ids: set[uuid.UUID] = set()
        self.workers: list[CeleryWorker | None] = [None] * config.workers
        self.expected_down: set[int] = set()
        self.failed_submits: set[uuid.UUID] = set()
        # invariant violations seen while running (an unplanned worker exit, a stalled worker)
        self.live_violations: list[str] = []
        self.faults_done = threading.Event()
        self.threads: list[threading.Thread] = []
        self.started = time.monotonic()

    def bump(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.counts[name] += n

    def say(self, message: str) -> None:
        if not self.config.quiet:
            print(f"[chaos {time.monotonic() - self.started:7.1f}s] {message}", flush=True)


def _pg_url(admin: str, name: str) -> str:
    base = admin.rsplit("/", 1)[0]
    return base.replace("postgresql://", "postgresql+psycopg://", 1) + "/" + name


def run(config: ChaosConfig) -> ChaosReport:
    """Run one seeded chaos round and return its report (violations listed, never raised)."""
    import psycopg

    from ..db.migrate import upgrade
    from ..db.session import make_engine, make_sessionmaker
    from ..runtime import Runtime
    from ..storage import LocalStorage
    from .simulator import Simulator

    seed = config.seed if config.seed is not None else random.SystemRandom().randrange(2**32)
    plan = make_plan(seed, config.jobs, rate=config.rate, workers=config.workers)
    workdir = Path(config.workdir or tempfile.mkdtemp(prefix=f"chaos-{seed}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    state = _Run(config, plan, workdir)
    state.say(f"seed={seed} plan={plan.digest()} jobs={config.jobs} window={plan.window:.1f}s "
              f"faults={Counter(f.action for f in plan.faults)} knobs={plan.sim_knobs} "
              f"workdir={workdir}")
    for fault in plan.faults:
        state.say(f"  scheduled {fault.action} at {fault.at:.2f}s"
                  + (f" worker={fault.target}" if fault.action == "kill_worker" else "")
                  + (f" down_for={fault.down_for}s" if fault.down_for else ""))

    db_name = f"chaos_{seed}_{os.getpid()}"
    with psycopg.connect(config.pg_admin, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{db_name}"')
    db_url = _pg_url(config.pg_admin, db_name)
    redis_server = ScratchRedis(log_path=workdir / "redis.log").start()
    sim = _quiet(Simulator(seed=seed).start())
    receiver: WebhookReceiver | None = None
    engine = None
    try:
        upgrade(db_url)
        sim.configure(**plan.sim_knobs)
        engine = make_engine(db_url, pool_size=12, max_overflow=8)
        sessions = make_sessionmaker(engine)
        sender = celery_sender(redis_server.url(0))
        create, poll = enqueuers(sender)
        receiver = WebhookReceiver(None)
        settings = sim.settings(
            database_url=db_url, broker_url=redis_server.url(0),
            storage_url=f"file://{workdir / 'media'}", time_scale=config.time_scale,
            webhook_base_url=receiver.base_url, events_redis_url=redis_server.url(1),
            broker_visibility_timeout=60, max_countdown=20, task_time_limit=30)
        rt = Runtime(settings=settings, sessions=sessions,
                     storage=LocalStorage(workdir / "media"),
                     enqueue_create=_counting(state, "lost_publishes", create),
                     enqueue_poll=_counting(state, "lost_publishes", poll))
        receiver.set_runtime(rt)
        receiver.start()
        sim.configure(elevenlabs_webhook_url=f"{receiver.base_url}/webhooks/elevenlabs")
        env = {**sim.env(), "RECONCILE_DATABASE_URL": db_url,
               "RECONCILE_BROKER_URL": redis_server.url(0),
               # max countdown + task time limit (20 + 30 s) below the visibility timeout
               "RECONCILE_BROKER_VISIBILITY_TIMEOUT": "60",
               "RECONCILE_MAX_COUNTDOWN": "20", "RECONCILE_TASK_TIME_LIMIT": "30",
               "RECONCILE_STORAGE_URL": f"file://{workdir / 'media'}",
               "RECONCILE_TIME_SCALE": str(config.time_scale),
               "RECONCILE_WEBHOOK_BASE_URL": receiver.base_url,
               "RECONCILE_EVENTS_REDIS_URL": redis_server.url(1)}
        _start_workers(state, env)
        _fund(rt, plan)
        _chaos_window(state, rt, sim, redis_server, env, db_name)
        _settle(state, rt, sim)
        _stop_workers(state)
        report = _check(state, rt, sim, receiver, redis_server)
    finally:
        _stop_workers(state)
        if receiver is not None:
            receiver.stop()
        sim.stop()
        redis_server.stop()
        if engine is not None:
            engine.dispose()
        if not config.keep:
            with psycopg.connect(config.pg_admin, autocommit=True, connect_timeout=10) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
            if config.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
    return report


def _quiet(sim: Any) -> Any:
    """A worker SIGKILLed mid-request hangs up on the simulator: that is the point of the run,
    not an error worth a traceback on stderr (other server errors still print)."""
    server = sim._server
    default = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            default(request, client_address)

    server.handle_error = handle_error
    return sim


def _counting(state: _Run, name: str, fn: Callable[..., None]) -> Callable[..., None]:
    """A publish that may fail (the broker is down): counted, swallowed — the sweep recovers."""

    def call(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            state.bump(name)
            log.info("chaos_publish_lost error=%s", exc)

    return call


def _start_workers(state: _Run, env: Mapping[str, str]) -> None:
    for index in range(state.config.workers):
        state.workers[index] = _spawn(state, index, env)
    for worker in state.workers:
        assert worker is not None
        worker.wait_ready()


def _spawn(state: _Run, index: int, env: Mapping[str, str]) -> CeleryWorker:
    return CeleryWorker(env, state.workdir / f"worker{index}.log",
                        concurrency=state.config.concurrency, name=f"chaos{index}")


def _stop_workers(state: _Run) -> None:
    for index, worker in enumerate(state.workers):
        if worker is not None:
            worker.stop()
            state.workers[index] = None


def _fund(rt: Any, plan: Plan) -> None:
    from .. import credits

    with rt.sessions.begin() as session:
        for user in range(plan.users):
            credits.grant(session, _user(plan, user), "sub", 10**9, f"chaos-grant-{plan.seed}-{user}")


def _user(plan: Plan, index: int) -> uuid.UUID:
    return uuid.UUID(int=(plan.seed << 32) + index + 1)


def _chaos_window(state: _Run, rt: Any, sim: Any, redis_server: ScratchRedis,
                  env: Mapping[str, str], db_name: str) -> None:
    """Submit every job on schedule while the faults fire and two sweepers overlap."""
    state.started = time.monotonic()  # the schedule's time zero: infrastructure is up
    state.say("chaos window opens")
    threads = [
        threading.Thread(target=_sweeper, args=(state, rt, state.plan.sweep_intervals[i]),
                         name=f"sweeper{i}", daemon=True) for i in range(2)
    ] + [
        threading.Thread(target=_faults, args=(state, redis_server, env, db_name),
                         name="faults", daemon=True),
        threading.Thread(target=_watchdog, args=(state, env, redis_server), name="watchdog",
                         daemon=True),
    ]
    for thread in threads:
        thread.start()
    state.threads = threads
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="sync-request") as requests_pool:
        for spec in state.plan.jobs:
            delay = state.started + spec.submit_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            _script_job(sim, spec)
            if _submit(state, rt, spec) and spec.kind in SYNC_KINDS:
                requests_pool.submit(_sync_request, state, rt, spec)
        state.faults_done.wait()
    state.say(f"window over: submitted={state.counts['submitted']} "
              f"kills={state.counts['kills']} pg_terminations={state.counts['pg_terminations']}")


def _script_job(sim: Any, spec: JobSpec) -> None:
    from .simulator import Script

    if spec.kind in SYNC_KINDS:
        return  # sync calls carry no job id upstream; their create mode is applied per call
    sim.script(spec.job_id, Script.from_dict(spec.script))


def _submit(state: _Run, rt: Any, spec: JobSpec) -> bool:
    """Submit as the platform would; retried through terminated backends (same job id)."""
    from sqlalchemy.exc import IntegrityError

    from .. import lifecycle

    model, inp = FAMILIES[spec.kind]
    for attempt in range(5):
        try:
            lifecycle.submit_job(rt, _user(state.plan, spec.user), spec.kind, model, inp,
                                 spec.credits, job_type="chaos", job_id=uuid.UUID(spec.job_id))
            state.bump("submitted")
            return True
        except IntegrityError:  # an earlier try committed before its connection died
            state.bump("submitted")
            return True
        except Exception as exc:
            log.info("chaos_submit_retry job_id=%s attempt=%d error=%s", spec.job_id, attempt, exc)
            time.sleep(0.1)
    state.bump("submit_failed")
    with state.lock:
        state.failed_submits.add(uuid.UUID(spec.job_id))
    return False


def _sync_request(state: _Run, rt: Any, spec: JobSpec) -> None:
    """The platform's request running a sync kind's call (a sync create mode is per call)."""
    from .. import sync
    from ..errors import ProviderError

    try:
        sync.run_sync(rt, uuid.UUID(spec.job_id))
    except ProviderError:
        pass
    except Exception as exc:  # a terminated backend mid-call: the sweep fails + refunds it
        log.info("chaos_sync_request_failed job_id=%s error=%s", spec.job_id, exc)
        state.bump("sync_requests_interrupted")


def _sweeper(state: _Run, rt: Any, interval: float) -> None:
    from ..sweep import sweep

    while not state.stop.is_set():
        try:
            report = sweep(rt)
            state.bump("sweeps")
            state.bump("sweep_errors", report.errors)
            with state.lock:
                for action in report.actions:
                    if action.outcome not in ("left", "lost", "error", "not_found", "anomaly"):
                        state.recovered_ids.add(action.job_id)
        except Exception as exc:
            state.bump("sweep_crashes")
            log.info("chaos_sweep_failed error=%s", exc)
        state.stop.wait(interval)


def _faults(state: _Run, redis_server: ScratchRedis, env: Mapping[str, str],
            db_name: str) -> None:
    """Fire the seeded schedule (the actions are the seed's; only their timing is noisy)."""
    for fault in state.plan.faults:
        delay = state.started + fault.at - time.monotonic()
        if delay > 0 and state.stop.wait(delay):
            break
        try:
            if fault.action == "kill_worker":
                _kill_worker(state, fault, env)
            elif fault.action == "redis_restart":
                state.say(f"redis restart (down {fault.down_for}s)")
                redis_server.restart(fault.down_for)
            elif fault.action == "pg_terminate":
                n = _pg_terminate(state.config.pg_admin, db_name)
                state.bump("pg_terminations")
                state.bump("pg_backends_terminated", n)
                state.say(f"pg_terminate_backend: {n} backends")
        except Exception:
            log.exception("chaos_fault_failed fault=%s", fault)
            state.bump("fault_errors")
    state.faults_done.set()


def _kill_worker(state: _Run, fault: Fault, env: Mapping[str, str]) -> None:
    index = fault.target
    worker = state.workers[index]
    with state.lock:
        state.expected_down.add(index)
    if worker is not None:
        worker.kill_group()
        worker.stop()
        state.bump("kills")
        state.say(f"SIGKILL worker{index} (process group); back in {fault.down_for}s")
    time.sleep(fault.down_for)
    state.workers[index] = _spawn(state, index, env)
    state.bump("worker_restarts")
    with state.lock:
        state.expected_down.discard(index)


# a live worker that receives no message for this long while messages wait in its queue has
# stopped consuming (what a liveness probe must catch): an invariant violation
STALL_SECONDS = 30.0


@dataclass
class _Progress:
    """How far one worker process's log has been read, and when it last received a task."""

    worker: CeleryWorker
    offset: int
    last_received: float


def _watchdog(state: _Run, env: Mapping[str, str], redis_server: ScratchRedis) -> None:
    """Every worker exit the schedule did not plan, and every worker that stops consuming while
    messages wait, is an invariant violation (recorded; the worker is then replaced, as a
    supervisor would, so the run can finish and report)."""
    progress: dict[int, _Progress] = {}
    waiting_since: float | None = None
    while not state.stop.wait(0.5):
        now = time.monotonic()
        depth = _queue_depth(redis_server)
        waiting_since = (waiting_since or now) if depth else None
        for index, worker in enumerate(state.workers):
            with state.lock:
                expected = index in state.expected_down
            if worker is None or expected:
                progress.pop(index, None)
                continue
            if not worker.alive():
                _violation(state, f"unplanned_worker_exit worker{index}: {worker.tail(600)!r}")
                state.bump("unplanned_worker_exits")
                _replace(state, index, env)
                continue
            seen = progress.get(index)
            if seen is None or seen.worker is not worker:
                seen = progress[index] = _Progress(worker, 0, now)
            seen.offset, received = _received_since(worker, seen.offset)
            if received:
                seen.last_received = now
            elif waiting_since is not None and now - max(seen.last_received, waiting_since) \
                    >= STALL_SECONDS:
                _violation(state, f"worker_stalled worker{index}: alive, no task received for "
                                  f"{now - seen.last_received:.0f}s while {depth} messages waited")
                state.bump("stalled_workers")
                worker.kill_group()
                _replace(state, index, env)


def _violation(state: _Run, text: str) -> None:
    state.say(text)
    with state.lock:
        state.live_violations.append(text)


def _replace(state: _Run, index: int, env: Mapping[str, str]) -> None:
    worker = state.workers[index]
    if worker is not None:
        worker.stop()
    state.workers[index] = _spawn(state, index, env)


def _received_since(worker: CeleryWorker, offset: int) -> tuple[int, int]:
    """(new offset, tasks received since ``offset``) from the worker's own log lines."""
    try:
        with open(worker.log_path, "rb") as fh:
            fh.seek(max(offset, worker.log_start))
            chunk = fh.read()
    except OSError:
        return offset, 0
    end = chunk.rfind(b"\n") + 1  # a half-written line is read next time
    return max(offset, worker.log_start) + end, chunk[:end].count(b"] received")


def _queue_depth(redis_server: ScratchRedis) -> int:
    """Messages waiting in the library's queues (0 when Redis is down: nothing can wait)."""
    import redis

    try:
        client = redis.Redis(port=redis_server.port, socket_timeout=1, socket_connect_timeout=1)
        return int(client.llen("reconcile")) + int(client.llen("reconcile.sweep"))
    except redis.RedisError:
        return 0


def _pg_terminate(admin: str, db_name: str) -> int:
    import psycopg

    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()", (db_name,)).fetchall()
    return len(rows)


def _settle(state: _Run, rt: Any, sim: Any) -> None:
    """Faults over: let the workers and the sweepers finish every job that can finish."""
    timeout = state.config.settle_timeout or (90.0 + state.config.jobs * 0.06)
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        pending = _unsettled(rt)
        if pending is not None and not pending:
            break
        if pending is not None and pending != last:
            state.say(f"settling: {len(pending)} jobs not settled yet")
            last = pending
        time.sleep(1.0)
    state.stop.set()
    for thread in state.threads:
        thread.join(timeout=30)
    from ..sweep import sweep

    for _ in range(3):  # a last quiet tick (every event republished, late refunds settled)
        try:
            sweep(rt)
            break
        except Exception:
            time.sleep(0.5)


def _unsettled(rt: Any) -> list[uuid.UUID] | None:
    """Jobs not settled yet: in flight (an ``uncertain`` one only while stored evidence names
    it — the sweep must adopt it), or terminal without ``credits_actual``. None: the database
    is unreachable."""
    from sqlalchemy import and_, or_, select

    from ..db.models import Job

    try:
        with rt.sessions() as session:
            return list(session.execute(select(Job.id).where(or_(
                and_(Job.status.in_(["pending", "processing"]),
                     or_(Job.submission_state.is_(None), Job.submission_state != "uncertain")),
                and_(Job.status.in_(["failed", "cancelled", "completed"]),
                     Job.credits_actual.is_(None)),
                Job.id.in_(_evidenced_uncertain())))).scalars())
    except Exception:
        return None


def _evidenced_uncertain() -> Any:
    """Uncertain jobs a stored webhook delivery names (with an upstream id): resolvable."""
    from sqlalchemy import select

    from ..db.models import Job, WebhookDelivery

    return select(WebhookDelivery.job_id).join(Job, Job.id == WebhookDelivery.job_id).where(
        Job.status == "pending", Job.submission_state == "uncertain",
        WebhookDelivery.upstream_id.is_not(None))


def _check(state: _Run, rt: Any, sim: Any, receiver: WebhookReceiver,
           redis_server: ScratchRedis) -> ChaosReport:
    """Every invariant, over the quiescent end state."""
    from sqlalchemy import func, select

    from .. import credits
    from ..db.models import Asset, CreditTransaction, Job, JobEvent, UsageLog
    from ..events import publish

    publish(rt, older_than=timedelta(0), limit=10**6)  # the outbox drains once all is quiet
    violations: list[str] = list(state.live_violations)
    specs = {uuid.UUID(s.job_id): s for s in state.plan.jobs}
    with rt.sessions() as session:
        jobs = {j.id: j for j in session.execute(select(Job)).scalars()}
        assets: dict[uuid.UUID, list[Asset]] = {}
        for asset in session.execute(select(Asset)).scalars():
            assets.setdefault(asset.job_id, []).append(asset)
        settlements = Counter(session.execute(
            select(CreditTransaction.job_id).where(
                CreditTransaction.id.like("job-commit:%") | CreditTransaction.id.like(
                    "job-refund:%"))).scalars())
        refunded = session.execute(select(func.count()).select_from(UsageLog).where(
            UsageLog.status == "refunded")).scalar_one()
        unpublished = session.execute(select(func.count()).select_from(JobEvent).where(
            JobEvent.published_at.is_(None))).scalar_one()
        problems = credits.audit(session, now=rt.now(), grace=timedelta(0), settings=rt.settings)
        evidenced = set(session.execute(_evidenced_uncertain()).scalars())

    for job_id, spec in specs.items():
        if job_id not in jobs and job_id not in state.failed_submits:
            violations.append(f"missing_job {job_id} ({spec.kind})")
    uncertain: list[str] = []
    outcomes: Counter[str] = Counter()
    tasks_by_job: dict[str, list[Any]] = {}
    for task in sim.tasks.values():
        tasks_by_job.setdefault(task.job_id or "", []).append(task)
    for job_id, job in jobs.items():
        kind = job.provider_kind or "?"
        outcomes[f"{job.status}:{job.error_code or 'ok'}"] += 1
        creates = sim.creates(str(job_id))
        if kind not in SYNC_KINDS and creates > 1:
            violations.append(f"duplicate_create {job_id} ({kind}): {creates} upstream tasks")
        if settlements[job_id] > 1:
            violations.append(f"double_settlement {job_id} ({kind})")
        if job.status in ("pending", "processing"):
            if job.submission_state == "uncertain":
                created = "created upstream" if creates else "never created"
                uncertain.append(f"{job_id} ({kind}, {created})")
                if job_id in evidenced:
                    violations.append(f"evidence_ignored {job_id} ({kind}): a stored webhook "
                                      f"names its upstream id, still uncertain")
            else:
                violations.append(f"not_terminal {job_id} ({kind}) status={job.status} "
                                  f"submission={job.submission_state}")
            continue
        if job.credits_actual is None:
            violations.append(f"unsettled {job_id} ({kind}) status={job.status}")
        mine = sorted(assets.get(job_id, []), key=lambda a: a.index)
        if job.status == "completed":
            outputs = (job.output_data or {}).get("outputs") or []
            if len(mine) != len(outputs) or [a.index for a in mine] != list(range(len(mine))) \
                    or not mine:
                violations.append(f"asset_rows {job_id} ({kind}): {len(mine)} rows for "
                                  f"{len(outputs)} outputs")
            if kind not in SYNC_KINDS:
                upstream = tasks_by_job.get(str(job_id), [])
                if not any(t.first_at({"succeeded"}, sim.now()) for t in upstream):
                    violations.append(f"completed_without_upstream_success {job_id} ({kind})")
                script = specs[job_id].script if job_id in specs else {}
                if kind != "elevenlabs-async" and script.get("outputs") and \
                        len(mine) != script["outputs"]:
                    violations.append(f"asset_count {job_id} ({kind}): {len(mine)} rows, "
                                      f"upstream made {script['outputs']}")
        else:
            if mine:
                violations.append(f"assets_on_{job.status}_job {job_id} ({kind})")
            if kind not in SYNC_KINDS:
                why = _refund_evidence(job, creates, tasks_by_job.get(str(job_id), []), sim)
                if why:
                    violations.append(f"refund_without_evidence {job_id} ({kind}): {why}")
    for job_id, rows in assets.items():
        for asset in rows:
            if not rt.storage.exists(asset.storage_key):
                violations.append(f"asset_object_missing {job_id} {asset.storage_key}")
    named = {a.storage_key for rows in assets.values() for a in rows}
    orphans = [key for key in rt.storage.keys() if key not in named]
    violations += [f"audit {p.kind} job={p.job_id} user={p.user_id}: {p.detail}" for p in problems]
    if unpublished:
        violations.append(f"events_unpublished {unpublished}")
    terminal = sum(1 for j in jobs.values() if j.status not in ("pending", "processing"))
    elapsed = time.monotonic() - state.started
    recovered = sum(1 for jid in state.recovered_ids
                    if jid in jobs and jobs[jid].status not in ("pending", "processing"))
    return ChaosReport(
        seed=state.plan.seed, plan_digest=state.plan.digest(), jobs=len(state.plan.jobs),
        by_kind=dict(Counter(s.kind for s in state.plan.jobs)), kills=state.counts["kills"],
        worker_restarts=state.counts["worker_restarts"],
        unplanned_worker_exits=state.counts["unplanned_worker_exits"],
        redis_restarts=redis_server.restarts,
        pg_terminations=state.counts["pg_terminations"],
        submit_failed=state.counts["submit_failed"], pg_backends_terminated=state.counts["pg_backends_terminated"],
        sweeps=state.counts["sweeps"], sweep_errors=state.counts["sweep_errors"],
        recovered=recovered,
        completed=sum(1 for j in jobs.values() if j.status == "completed"),
        failed=sum(1 for j in jobs.values() if j.status in ("failed", "cancelled")),
        refunded=int(refunded), uncertain=sorted(uncertain), orphans=len(orphans),
        lost_publishes=state.counts["lost_publishes"],
        webhook_answers={str(k): v for k, v in sorted(receiver.answers.items())},
        violations=violations, seconds=elapsed, throughput=terminal / elapsed if elapsed else 0.0,
        outcomes=dict(outcomes))


def _refund_evidence(job: Any, creates: int, upstream: list[Any], sim: Any) -> str | None:
    """Why this async job's refund is NOT backed by evidence (None: it is). Automatic refunds
    need a rejection, a provider-reported failure, or a create that never happened."""
    code = job.error_code
    if code in ("UPSTREAM_INVALID_INPUT", "UPSTREAM_SUBMISSION_FAILED", "UPSTREAM_RATE_LIMITED",
                "RECONCILE_NO_RECOVERY"):
        return f"{code} but created upstream" if creates else None
    states = {t.state_at(sim.now())[0] for t in upstream}
    if code == "UPSTREAM_FAILED":
        return None if states & {"failed", "canceled"} else f"{code} but upstream is {states}"
    if code == "UPSTREAM_EMPTY_RESULT":
        ok = any(t.state_at(sim.now())[0] == "succeeded" and t.script.outputs == 0
                 for t in upstream)
        return None if ok else f"{code} but upstream is {states}"
    return f"unexpected code {code} (no exhaustion or cancel happens in a chaos run)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reconcile.testing.chaos",
                                     description="Seeded chaos run checked against invariants.")
    parser.add_argument("--jobs", "-n", type=int, default=300)
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--rate", type=float, default=12.0, help="jobs submitted per second")
    parser.add_argument("--settle-timeout", type=float, default=None)
    parser.add_argument("--pg-admin", default=os.environ.get("RECONCILE_TEST_PG_ADMIN",
                                                             PG_ADMIN_DEFAULT))
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the database and workdir")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--verbose", action="store_true", help="the library's own logs too")
    parser.add_argument("--json", action="store_true", help="also print the report as JSON")
    args = parser.parse_args(argv)
    # the library logs every injected failure (terminated backends, a dead broker) with its
    # traceback, as it should in production: here that is expected noise around the report
    logging.basicConfig(level=logging.INFO if args.verbose else logging.CRITICAL,
                        format="%(levelname)s %(name)s %(message)s")
    report = run(ChaosConfig(jobs=args.jobs, seed=args.seed, workers=args.workers,
                             concurrency=args.concurrency, time_scale=args.time_scale,
                             rate=args.rate, settle_timeout=args.settle_timeout,
                             pg_admin=args.pg_admin, workdir=args.workdir, keep=args.keep,
                             quiet=args.quiet))
    print(report.text(), flush=True)
    if args.json:
        print(json.dumps(asdict(report), default=str), flush=True)
    return 0 if report.ok() else 1


if __name__ == "__main__":
    raise SystemExit(main())
