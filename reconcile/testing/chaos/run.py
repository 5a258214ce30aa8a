"""One chaos run (see :mod:`reconcile.testing.chaos`): the infrastructure up, the jobs submitted
on schedule while the faults fire and two sweepers overlap, the system left to settle, the
invariants checked; and the command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ..processes import ScratchRedis, WebhookReceiver, celery_sender, enqueuers
from .checks import _check, _evidenced_uncertain
from .control import (
    DEFAULT_POLL_MODE,
    PG_ADMIN_DEFAULT,
    ChaosConfig,
    _counting,
    _faults,
    _pg_url,
    _quiet,
    _Run,
    _start_workers,
    _stop_workers,
    _watchdog,
    log,
)
from .plan import FAMILIES, OBSERVED_KIND, SYNC_KINDS, JobSpec, Plan, make_plan
from .platform_rows import PLATFORM_JOB_TYPE, insert_platform_row
from .policy import choose_policy, parse_policy, policy_env, policy_text
from .report import ChaosReport
from .shape import _database_shape, _shape_database
from .sweepers import sweeper as _sweeper


def run(config: ChaosConfig) -> ChaosReport:
    """Run one seeded chaos round and return its report (violations listed, never raised)."""
    import psycopg

    from ...db.migrate import upgrade
    from ...db.session import make_engine, make_sessionmaker
    from ...runtime import Runtime
    from ...storage import LocalStorage
    from ..simulator import Simulator

    seed = config.seed if config.seed is not None else random.SystemRandom().randrange(2**32)
    plan = make_plan(seed, config.jobs, rate=config.rate, workers=config.workers)
    policy = choose_policy(seed, config.policy)
    config = replace(config, policy=policy_text(policy))  # the replay line repeats it
    workdir = Path(config.workdir or tempfile.mkdtemp(prefix=f"chaos-{seed}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    state = _Run(config, plan, workdir)
    state.say(f"seed={seed} plan={plan.digest()} jobs={config.jobs} window={plan.window:.1f}s "
              f"faults={Counter(f.action for f in plan.faults)} knobs={plan.sim_knobs} "
              f"workdir={workdir} policy={config.policy} observe_only={OBSERVED_KIND}")
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
        _shape_database(config, db_name)
        upgrade(db_url)
        database = _database_shape(config, db_name, db_url)
        state.say(f"database: {database}")
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
            broker_visibility_timeout=60, max_countdown=20, task_time_limit=30,
            failure_refund=policy.failure_refund, cancel_refund=policy.cancel_refund,
            observe_only_kinds=[OBSERVED_KIND], poll_mode=config.poll_mode)
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
               "RECONCILE_EVENTS_REDIS_URL": redis_server.url(1), **policy_env(policy),
               "RECONCILE_OBSERVE_ONLY_KINDS": json.dumps([OBSERVED_KIND]),
               "RECONCILE_POLL_MODE": config.poll_mode}
        _start_workers(state, env)
        _fund(rt, plan)
        _chaos_window(state, rt, sim, redis_server, env, db_name, sender)
        _settle(state, rt, sim)
        _stop_workers(state)
        report = _check(state, rt, sim, receiver, redis_server)
        report.options, report.database = config.shape_options(), database
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


def _fund(rt: Any, plan: Plan) -> None:
    from ... import credits

    with rt.sessions.begin() as session:
        for user in range(plan.users):
            credits.grant(session, _user(plan, user), "sub", 10**9, f"chaos-grant-{plan.seed}-{user}")


def _user(plan: Plan, index: int) -> uuid.UUID:
    return uuid.UUID(int=(plan.seed << 32) + index + 1)


def _chaos_window(state: _Run, rt: Any, sim: Any, redis_server: ScratchRedis,
                  env: Mapping[str, str], db_name: str, sender: Any) -> None:
    """Submit every job on schedule while the faults fire and two sweepers overlap (and, in
    batch mode, the beat thread sends the batch poller's ticks)."""
    state.started = time.monotonic()  # the schedule's time zero: infrastructure is up
    state.say("chaos window opens")
    beat = [threading.Thread(target=_poll_due_beat, args=(state, rt, sender), name="beat",
                             daemon=True)] if rt.settings.poll_mode == "batch" else []
    # the second sweeper's ticks are past their budget: the fan-out and the hand-over run
    threads = beat + [threading.Thread(target=_sweeper, args=(
        state, rt, state.plan.sweep_intervals[i], i == 1), name=f"sweeper{i}", daemon=True)
        for i in range(2)] + [
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
            if spec.platform:
                insert_platform_row(state, rt, spec, _user(state.plan, spec.user))
                continue
            _script_job(sim, spec)
            if _submit(state, rt, spec) and spec.kind in SYNC_KINDS:
                requests_pool.submit(_sync_request, state, rt, spec)
        state.faults_done.wait()
    state.say(f"window over: submitted={state.counts['submitted']} "
              f"kills={state.counts['kills']} pg_terminations={state.counts['pg_terminations']}")


def _script_job(sim: Any, spec: JobSpec) -> None:
    from ..simulator import Script

    if spec.kind in SYNC_KINDS:
        return  # sync calls carry no job id upstream; their create mode is applied per call
    sim.script(spec.job_id, Script.from_dict(spec.script))


def _submit(state: _Run, rt: Any, spec: JobSpec) -> bool:
    """Submit as the platform would; retried through terminated backends (same job id)."""
    from sqlalchemy.exc import IntegrityError

    from ... import lifecycle

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
    from ... import sync
    from ...errors import ProviderError

    try:
        sync.run_sync(rt, uuid.UUID(spec.job_id))
    except ProviderError:
        pass
    except Exception as exc:  # a terminated backend mid-call: the sweep fails + refunds it
        log.info("chaos_sync_request_failed job_id=%s error=%s", spec.job_id, exc)
        state.bump("sync_requests_interrupted")


def _poll_due_beat(state: _Run, rt: Any, sender: Any) -> None:
    """Batch mode's beat: ``reconcile.poll_due`` to the workers on the library's beat tick
    (``Settings.poll_due_tick``); a tick lost to a dead broker is the next one's."""
    every, expires = rt.settings.poll_due_tick
    while not state.stop.is_set():
        try:
            sender.send_task("reconcile.poll_due", args=[], expires=expires)
            state.bump("poll_due_ticks")
        except Exception as exc:  # the broker is down (a planned restart)
            state.bump("poll_due_ticks_lost")
            log.info("chaos_poll_due_tick_lost error=%s", exc)
        state.stop.wait(every)


def _settle(state: _Run, rt: Any, sim: Any) -> None:
    """Faults over: let the workers and the sweepers finish every job that can finish.

    No fixed wait decides "stuck": an in-flight job is waited for until its liveness horizon,
    the bound the library itself promises (:func:`_horizon`); the wait ends as soon as nothing
    is left, and at the latest once every job left is past its horizon and the floor
    (``settle_timeout``, default 90 s + 0.06 s a job) is over. A slow host only makes the wait
    longer; a job the library loses is still reported, one horizon after it started."""
    from ...jobstore.horizon import kind_horizon
    from ...states import ATTEMPT_SPACING

    started = time.monotonic()
    floor = started + (state.config.settle_timeout or (90.0 + state.config.jobs * 0.06))
    cap = floor + max(rt.settings.scaled(kind_horizon(rt.kind(kind)) + ATTEMPT_SPACING)
                      for kind in FAMILIES).total_seconds()
    last = None
    while time.monotonic() < cap:  # the cap: a database that never answers again
        pending = _unsettled(rt)
        if pending is not None and not pending:
            break
        now = time.monotonic()
        if pending is not None:
            if len(pending) != last:
                state.say(f"settling: {len(pending)} jobs not settled yet")
                last = len(pending)
            wall = rt.now()
            if now >= floor and all(horizon <= wall for _, horizon in pending):
                break
        time.sleep(1.0)
    state.settle_seconds = time.monotonic() - started
    state.stop.set()
    for thread in state.threads:
        thread.join(timeout=30)
    from ...sweep import sweep

    for _ in range(3):  # a last quiet tick (every event republished, late refunds settled)
        try:
            sweep(rt)
            break
        except Exception:
            time.sleep(0.5)


def _horizon(rt: Any, job: Any) -> datetime:
    """The latest an in-flight job may still legitimately finish, as the library itself bounds
    it (:mod:`reconcile.jobstore.horizon`): the later of its kind's horizon after its start
    (threshold, then every attempt on schedule) and its own exhaustion deadline (attempts that
    started over: adopted, resumed), plus one attempt spacing of slack; scaled. A terminal job
    not settled yet, and a job the sweep only observes (OBSERVE_ONLY_KINDS: nothing resumes
    it), get the floor only (its horizon is its creation)."""
    from ...jobstore import horizon
    from ...jobstore.adoption import observe_only
    from ...states import ATTEMPT_SPACING, IN_FLIGHT

    kind = rt.kind(job.provider_kind)
    created: datetime = job.created_at
    if job.status not in IN_FLIGHT or kind is None or observe_only(rt.settings, job):
        return created
    latest: datetime = horizon.job_start(job) + rt.settings.scaled(horizon.kind_horizon(kind))
    deadline = horizon.exhaustion_deadline(rt.settings, job)
    if deadline is not None:
        latest = max(latest, deadline)
    slack: timedelta = rt.settings.scaled(ATTEMPT_SPACING)
    return latest + slack


def _unsettled(rt: Any) -> list[tuple[uuid.UUID, datetime]] | None:
    """Jobs not settled yet, each with its :func:`_horizon`: in flight (an ``uncertain`` one
    only while stored evidence names it — the sweep must adopt it), or terminal without
    ``credits_actual``. None: the database is unreachable."""
    from sqlalchemy import and_, or_, select

    from ...db.models import Job

    try:
        with rt.sessions() as session:
            jobs = session.execute(select(Job).where(or_(
                and_(Job.status.in_(["pending", "processing"]),
                     or_(Job.submission_state.is_(None), Job.submission_state != "uncertain")),
                and_(Job.status.in_(["failed", "cancelled", "completed"]),
                     Job.credits_actual.is_(None)),
                Job.id.in_(_evidenced_uncertain())))).scalars()
            return [(job.id, _horizon(rt, job)) for job in jobs
                    if job.job_type != PLATFORM_JOB_TYPE]  # the platform's: left as they are
    except Exception:
        return None


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
    # the run's shape (ChaosConfig.shape_options): each option's dest is a ChaosConfig field
    parser.add_argument("--db-timezone", default=None, metavar="ZONE",
                        help="the database's default TimeZone, e.g. America/New_York")
    parser.add_argument("--naive-timestamps", action="store_true",
                        help="the platform's jobs/usage_logs with timestamp without time zone "
                             "columns (holding UTC)")
    parser.add_argument("--poll-mode", default=DEFAULT_POLL_MODE, choices=("chain", "batch"),
                        help="RECONCILE_POLL_MODE in every process (default: the library's; "
                             "batch: the run sends the poll_due ticks beat would)")
    parser.add_argument("--policy", default=None, metavar="FAILURE,CANCEL",
                        help="the settlement policy's refund shares, e.g. 1/2,1/3 (default: "
                             "drawn from the seed)")
    args = parser.parse_args(argv)
    if args.policy is not None:
        try:
            parse_policy(args.policy)
        except ValueError as exc:
            parser.error(str(exc))
    # the library logs every injected failure (terminated backends, a dead broker) with its
    # traceback, as it should in production: here that is expected noise around the report
    logging.basicConfig(level=logging.INFO if args.verbose else logging.CRITICAL,
                        format="%(levelname)s %(name)s %(message)s")
    config = {f.name: getattr(args, f.name) for f in fields(ChaosConfig) if hasattr(args, f.name)}
    report = run(ChaosConfig(**config))
    print(report.text(), flush=True)
    if args.json:
        print(json.dumps(asdict(report), default=str), flush=True)
    return 0 if report.ok() else 1
