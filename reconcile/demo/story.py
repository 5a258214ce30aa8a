"""The demo's story, end to end (see :mod:`reconcile.demo`): set up, submit, crash worker A
(mid-poll in chain mode, right after it claimed a batch in batch mode), start worker B, let the
sweep (and, in batch mode, the released or expired claims) recover, then report; plus the
``--request`` process (the platform's request handler for the sync kinds) and the command
line."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..core.redact import database_url
from .checks import _is_sync, _provider
from .claims import ReapWatch, discarded_ticks, held_claims, reaped_by, workers_of
from .plan import (
    DEADLINE,
    DEFAULT_TIME_SCALE,
    GRANTS,
    LONG,
    QUICK,
    SWEEP_EVERY,
    SYNC_CRASH_POINT,
    Story,
    batch,
)
from .processes import (
    Children,
    PollDueBeat,
    Printer,
    Setup,
    Sweeper,
    broker_backlog,
    prepare,
    snapshot,
    wait_ready,
    wait_until,
    wipe,
    worker_argv,
)
from .report import report, show_console, show_uncertain


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    say = Printer(t0)
    children = Children()
    atexit.register(children.stop_all)
    work = Path(args.workdir).resolve()
    wipe(work)
    logs = work / "logs"
    scale = float(args.time_scale)

    from ..testing.processes import WebhookReceiver
    from ..testing.simulator import Script, Simulator

    sim = Simulator(time_scale=scale).start()
    hooks: WebhookReceiver | None = None
    sweeper: Sweeper | None = None
    beat: PollDueBeat | None = None
    watch: ReapWatch | None = None
    try:
        # the platform's webhook route, POST <base>/webhooks/<provider>?job_id=…: it listens at
        # once (its URL goes into WEBHOOK_BASE_URL) and gets the runtime once that exists
        hooks = WebhookReceiver(None).start()
        hooks_url = hooks.base_url
        setup = prepare(work, scale, hooks_url, sim.env())
        os.environ.update({k: v for k, v in setup.env.items() if k.startswith("RECONCILE_")})
        os.environ.update(NO_PROXY=setup.env["NO_PROXY"], no_proxy=setup.env["no_proxy"])

        from .. import credits, tasks
        from ..celery_app import app
        from ..db.migrate import upgrade
        from ..db.session import normalise_url

        # Celery's "current app" is thread-local: in the sweep and webhook threads the shared
        # tasks would otherwise resolve to Celery's default app (amqp://localhost) and publish
        # there. Make the reconcile app the default for every thread of this process.
        app.set_default()
        app.set_current()

        say(f"reconcile demo — work folder {work}")
        say(f"database {_redact(setup.database_url)}{' (embedded SQLite, WAL)' if setup.embedded_db else ''}; "
            f"broker {_redact(setup.env['RECONCILE_BROKER_URL'])}"
            f"{' in ' + setup.env['RECONCILE_BROKER_FOLDER'] if setup.embedded_broker else ''}; "
            f"storage {setup.env['RECONCILE_STORAGE_URL']}")
        say(f"TIME_SCALE={scale:g}: one provider minute = {60 * scale:g} s; sweep every "
            f"{SWEEP_EVERY:g} s; simulator at {sim.url}, webhooks at {hooks_url}")
        upgrade(normalise_url(setup.database_url))
        if not setup.embedded_broker:
            broker_backlog(app, say, purge=args.purge_broker)
        rt = tasks.get_runtime()
        hooks.set_runtime(rt)
        say("migrated; simulator and webhook endpoint up")

        plans = batch()
        story = Story(plans, [uuid.uuid4() for _ in plans], [uuid.uuid4() for _ in GRANTS],
                      mode=setup.poll_mode)
        batched = story.mode == "batch"
        every, expires = rt.settings.poll_due_tick
        say(f"poll mode {story.mode}: " + (
            f"rows carry their due times; this process sends reconcile.poll_due every "
            f"{every:g} s (expiring after {expires:g} s), as celery beat would"
            if batched else "one reconcile.poll message per status read"))
        with rt.sessions.begin() as session:
            for user, grants in zip(story.users, GRANTS, strict=True):
                for pool, amount in grants:
                    credits.grant(session, user, pool, amount, f"demo-grant:{user}:{pool}")
        say(f"granted credits to {len(story.users)} users: "
            + "; ".join(f"{str(u)[:8]} sub {g[0][1]} + topup {g[1][1]}"
                        for u, g in zip(story.users, GRANTS, strict=True)))

        # worker A, with a once-only crash (mid-poll, or right after a batch claim): the marker
        # file exists = disarmed
        marker = work / "crash-once.marker"
        marker.touch()
        env_a = {**setup.env, "RECONCILE_TEST_CRASH_AT": story.crash_point,
                 "RECONCILE_TEST_CRASH_ONCE": str(marker), "RECONCILE_TEST_CRASH_MODE": "group"}
        worker_a = children.spawn("worker A", worker_argv("A"), env_a, logs / "worker-A.log")
        wait_ready(worker_a, logs / "worker-A.log")
        say(f"worker A ready (pid {worker_a.pid}, prefork -c 2, own process group)")

        sweeper = Sweeper(rt, SWEEP_EVERY, say,
                          fan_out=lambda job_id: tasks.reconcile_job.delay(str(job_id)))
        beat = PollDueBeat(every, expires) if batched else None
        submit_all(rt, sim, story, Script)
        say(f"submitted {len(plans)} jobs "
            f"({sum(not _is_sync(p.kind) for p in plans)} async via worker creates, "
            f"{sum(_is_sync(p.kind) for p in plans)} sync via the request process)")
        requests_done = start_requests(children, setup, story, logs, say)
        sweeper.start()
        if beat is not None:
            beat.start()

        # wait for every create to be decided and the quick jobs to finish, then crash worker A
        by_id = story.by_id()
        async_ids = [i for i in story.ids if not _is_sync(by_id[i].kind)]
        long_ids = [i for i in async_ids if by_id[i].timeline and by_id[i].timeline[-1][0] >= LONG]

        def creates_decided() -> bool:
            jobs = snapshot(rt, async_ids)
            return all(j.submission_state not in ("not_started", "submitting") for j in jobs.values())

        # never crash A while a create may be in flight: that job would (rightly) turn
        # uncertain, and the story would have two
        if not wait_until(creates_decided, max(5.0, DEADLINE / 2 - say.elapsed())):
            say("DEMO FAILED: creates were not all decided in time; worker A not crashed",
                stamp=False)
            return 1
        quick = [i for i in async_ids if i not in long_ids and by_id[i].expect != "uncertain"]
        # the long jobs must still be polling when A dies: wait for the quick ones a little only
        wait_until(lambda: all(j.status in ("completed", "failed")
                               for j in snapshot(rt, quick).values()), LONG - QUICK - 1.0)
        jobs = snapshot(rt, async_ids)
        say("creates decided: " + _count(j.submission_state for j in jobs.values())
            + "; " + _count(j.status for j in jobs.values()))
        story.in_flight_at_crash = [i for i, j in jobs.items() if j.status == "processing"]
        if batched:  # A's liveness rows, one per pool process: the claims it makes carry them
            story.a_workers = workers_of(rt, worker_a.pid)
        marker.unlink()
        say(f"armed the once-only '{story.crash_point}' crash in worker A "
            f"({len(story.in_flight_at_crash)} jobs "
            + ("in flight, read in batches: A dies at its next claim)" if batched else
               "have live poll chains)"))
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker_a.wait(timeout=15)
        story.crash_rc = worker_a.poll()
        children.signal_group(worker_a, signal.SIGKILL)  # nothing of A survives, whatever happened
        if story.crash_rc is None:
            say("!! worker A did not crash")
            worker_a.wait(timeout=5)
        elif batched:
            story.crashed_at = rt.now()
            story.held_at_crash = held_claims(rt, async_ids, story.a_workers)
            watch = ReapWatch(rt, story.a_workers).start()
            lease = max((u for _, u in story.held_at_crash.values()),
                        default=story.crashed_at) - story.crashed_at
            say(f"worker A died right after claiming a batch: whole process group SIGKILLed "
                f"(exit {story.crash_rc}); it holds {len(story.held_at_crash)} row(s) claimed "
                f"for {lease.total_seconds():.1f} s more (the claim lease) — unless a "
                f"reaper sees its heartbeat lapse first ({rt.settings.heartbeat_timeout:g} s "
                f"without a beat)")
        else:
            say(f"worker A died mid-poll: whole process group SIGKILLed (exit {story.crash_rc}); "
                + ("the poll messages it held are gone: the filesystem broker never redelivers"
                   if setup.embedded_broker else
                   "the broker would return its unacked messages only after the visibility "
                   "timeout"))

        worker_b = children.spawn("worker B", worker_argv("B"), setup.env, logs / "worker-B.log")
        wait_ready(worker_b, logs / "worker-B.log")
        say(f"worker B ready (pid {worker_b.pid}); " + (
            "it claims A's rows once they are released (A's heartbeat lapsed) or due again "
            "(their claim lease ended)" if batched else
            "the sweep resumes chains whose poll lease expired"))

        uncertain_ids = [i for i in story.ids if by_id[i].expect == "uncertain"]

        def settled() -> bool:
            jobs = snapshot(rt, story.ids)
            return all((j.status in ("completed", "failed") and j.credits_actual is not None)
                       or (i in uncertain_ids and j.status == "pending")
                       for i, j in jobs.items()) and requests_done()

        remaining = max(5.0, DEADLINE - say.elapsed())
        if wait_until(settled, remaining, 0.5):
            say("every job is settled except the uncertain one, which waits for an operator")
        else:
            say(f"!! not everything settled within {DEADLINE:.0f} s of the start")
        sweeper.stop()
        if beat is not None:
            beat.stop()
            story.poll_due_ticks = beat.sent
        sweeper.tick()  # one last tick after the dust settles: it must change nothing
        story.worker_b_rc = worker_b.poll()
        if batched:
            story.b_workers = workers_of(rt, worker_b.pid)
        for name, proc, _ in list(children.procs):
            if name.startswith("worker"):  # cold shutdown: nothing is left to finish
                children.stop(proc, signal.SIGQUIT, grace=1.5)
        say("workers stopped")
        if watch is not None:
            watch.stop()
            story.a_reaped_at = watch.gone_at
            story.reaped_by = reaped_by(logs / "worker-B.log", story.a_workers)
            story.poll_due_discarded = sum(discarded_ticks(logs / f"worker-{name}.log")
                                           for name in "AB")
        for name, proc, _ in list(children.procs):
            if name.startswith("request"):
                story.sync_rcs[name] = proc.poll()

        show_uncertain(setup, uncertain_ids, say)
        show_console(setup, uncertain_ids, say)
        failures = report(rt, sim, story, sweeper, say)
        took = say.elapsed()
        say(f"took {took:.1f} s")
        if failures:
            say(f"DEMO FAILED: {len(failures)} invariant(s) broken", stamp=False)
            for failure in failures:
                say(f"  ✗ {failure}", stamp=False)
            say(f"logs: {logs}", stamp=False)
            return 1
        say("DEMO OK: every invariant holds", stamp=False)
        return 0
    finally:
        if sweeper is not None:
            sweeper.stop()
        if beat is not None:
            beat.stop()
        if watch is not None:
            watch.stop()
        children.stop_all()
        if hooks is not None:
            with contextlib.suppress(Exception):
                hooks.stop()
        sim.stop()


def _redact(url: str) -> str:
    return database_url(url)  # every credential form, as the CLI's database line


def _count(values: Iterable[Any]) -> str:
    counts: dict[str, int] = {}
    for value in values:
        counts[str(value)] = counts.get(str(value), 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def submit_all(rt: Any, sim: Any, story: Story, script_cls: Any) -> None:
    from ..lifecycle import submit_job

    for job_id, plan in zip(story.ids, story.plans, strict=True):
        if not rt.kind(plan.kind).sync:
            sim.script(str(job_id), script_cls(timeline=tuple((t / sim.time_scale, s)
                                                              for t, s in plan.timeline),
                                               outputs=plan.outputs, create=plan.create,
                                               webhook=plan.webhook))
        submit_job(rt, story.users[plan.user], plan.kind, plan.model, dict(plan.input),
                   plan.credits, job_type="demo-" + _provider(plan.kind), job_id=job_id)


def start_requests(children: Children, setup: Setup, story: Story, logs: Path,
                   say: Printer) -> Callable[[], bool]:
    """The platform's request process runs the sync kinds; a second one dies mid-call."""
    by_id = story.by_id()
    fine = [str(i) for i in story.ids if by_id[i].crash is False and _is_sync(by_id[i].kind)]
    doomed = [str(i) for i in story.ids if by_id[i].crash]
    argv = [sys.executable, "-m", "reconcile.demo", "--request"]
    procs = [children.spawn("request", argv + fine, setup.env, logs / "request.log")]
    crash_env = {**setup.env, "RECONCILE_TEST_CRASH_AT": SYNC_CRASH_POINT,
                 "RECONCILE_TEST_CRASH_MODE": "self"}
    procs.append(children.spawn("request (dies)", argv + doomed, crash_env,
                                logs / "request-dies.log"))
    say(f"request process runs {len(fine)} sync calls; another is SIGKILLed at "
        f"'{SYNC_CRASH_POINT}' for job {doomed[0][:8]}")
    reported: set[int] = set()

    def done() -> bool:
        for proc in procs:
            rc = proc.poll()
            if rc is not None and proc.pid not in reported:
                reported.add(proc.pid)
                say(f"request process {proc.pid} exited {rc}"
                    + (" (SIGKILLed inside the sync call)" if rc == -signal.SIGKILL else ""))
        return all(proc.poll() is not None for proc in procs)

    return done


def request_process(job_ids: list[str]) -> int:
    """``--request``: what the platform's request handler does for a sync kind."""
    from .. import tasks
    from ..sync import run_sync

    rt = tasks.get_runtime()  # installs the crash hook when RECONCILE_TEST_CRASH_AT is set
    for job_id in job_ids:
        job = run_sync(rt, uuid.UUID(job_id))
        print(f"request job={job_id} status={job.status} code={job.error_code}", flush=True)
    return 0


# ----------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reconcile.demo",
        description="Crash a worker, drop a create, kill a sync request — and account for "
                    "every credit. Needs no database or broker server.")
    parser.add_argument("--workdir", default="demo-run",
                        help="work folder, wiped at start (default ./demo-run)")
    parser.add_argument("--time-scale", type=float, default=DEFAULT_TIME_SCALE,
                        help=f"RECONCILE_TIME_SCALE for the run (default {DEFAULT_TIME_SCALE})")
    parser.add_argument("--purge-broker", action="store_true",
                        help="with RECONCILE_BROKER_URL: empty the reconcile queues first")
    parser.add_argument("--request", nargs="+", metavar="JOB_ID", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.request:
        return request_process(args.request)

    def terminate(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through run()'s finally: children are killed

    signal.signal(signal.SIGTERM, terminate)
    return run(args)

