"""``python -m reconcile.demo`` (also ``reconcile demo``): the whole crash-and-money story, end
to end, on one machine with no database or broker server, in well under 90 seconds.

What runs (all on loopback, all cleaned up — process groups killed — even on failure):

* an SQLite file, the ``filesystem://`` Celery broker and local-folder storage in a fresh work
  folder (``./demo-run/``, wiped at start);
* the provider simulator (a thread of this process) and the platform's webhook endpoint (another
  thread, calling :func:`reconcile.webhook_ingest.handle_webhook`);
* real ``celery -A reconcile.celery_app worker --pool=prefork -c 2`` subprocesses, each in its own
  process group;
* a stand-in for the platform's request process (a subprocess of this module, ``--request``) that
  runs the sync kinds through :func:`reconcile.sync.run_sync`.

``RECONCILE_TIME_SCALE`` (default 0.05 here) multiplies every threshold, interval and lease, and
the simulator plays its timelines at the same scale, so one provider minute takes 3 s: the 5-min
sync threshold becomes 15 s, a KIE poll lease (2 × 5 s + 30 s) 2 s. Poll intervals shrink too
(Replicate/fal every 0.15 s); at 0.02 (``--time-scale 0.02``, ~17 s) the 0.8 s leases are shorter
than a busy worker's scheduling jitter, so the sweep also "resumes" chains that were merely late —
harmless (the stale chain is fenced) but it blurs the story, hence 0.05.

The story, on a mixed batch of 20 jobs (KIE market, KIE Veo, Replicate, ElevenLabs dubbing, fal
queue, and the sync kinds anthropic-sync / kie-llm):

1. Worker A does the creates and starts the poll chains. Once every create is decided, its
   ``mid_poll`` crash point is armed (``RECONCILE_TEST_CRASH_AT=mid_poll`` with a once-only
   marker file that exists — disarmed — until the demo deletes it) and worker A SIGKILLs its
   whole process group in the middle of a poll. The ``filesystem://`` broker never redelivers
   after a whole-worker crash: the poll messages A held (ETA countdowns, the one it was running)
   are gone.
2. Worker B starts. Nothing hands it A's work except the library's own state: each dead chain's
   poll lease expires, and the sweep resumes it under a new generation (``sweep-resumed``).
3. One create's connection drops after the provider accepted it (``Script(create=
   "drop_after_accept")``): the job is ``uncertain``, keeps its reservation, is never resubmitted,
   and is left for an operator (shown with ``python -m reconcile uncertain``).
4. One task fails upstream: failed with ``UPSTREAM_FAILED`` and refunded.
5. One sync call's request process is SIGKILLed right after the provider answered
   (``RECONCILE_TEST_CRASH_AT=sync_after_call``): the row stays ``submitting``; past the kind's
   threshold the sweep fails it ``RECONCILE_NO_RECOVERY`` and refunds it.
6. Everything else completes, some through signed webhooks.

**The sweep driver.** This process calls :func:`reconcile.sweep.sweep` every
``SWEEP_INTERVAL × TIME_SCALE`` seconds (a thread), rather than running ``celery beat``. Why:
(a) the story has a window in which *no* worker is alive (A dead, B starting); a beat tick sent
to the ``reconcile.sweep`` queue would wait in the broker until B is up (or expire), whereas an
in-process tick keeps deciding and queues the resumed chains for B; (b) the demo prints each
tick's ``[reconcile] …`` line from the returned report instead of scraping worker logs; (c) one
fewer process to start. It is the same function the ``reconcile.sweep`` task runs, with the same
fan-out (``reconcile.reconcile_job`` on the workers) past the tick's time budget, so recovery
does not depend on the driver; production runs it from one ``celery beat``.

It prints the story as it happens, a table per job (outcome, error code, upstream creates from
the simulator's counters, credits reserved / committed / refunded, how it was settled), the sweep
tick lines, the operator view of the uncertain job and the ledger audit, and exits 0 only if every
invariant holds (:func:`check` per job, :func:`report` for the run). "Settled by": ``worker`` (its
first poll chain), ``sweep-resumed`` (a chain the sweep restarted), ``webhook``, ``sweep-poll``
(the sweep's own read past the threshold), ``request`` (a sync call), ``refunded-by-sweep``,
``left-uncertain``.

With ``RECONCILE_DATABASE_URL`` (e.g. PostgreSQL) and/or ``RECONCILE_BROKER_URL`` (e.g. Redis)
set, the demo uses them instead: the database is migrated but never wiped, and only this run's
jobs and users are counted. The sweep still acts on every row of that database, as it would in
production (stale rows of other runs get failed and refunded): point it at a scratch database.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

DEFAULT_TIME_SCALE = 0.05
SWEEP_EVERY = 1.0  # real seconds between sweep ticks (SWEEP_INTERVAL = this / TIME_SCALE)
DEADLINE = 80.0  # real seconds from start by which every job must be settled
CRASH_POINT = "mid_poll"
SYNC_CRASH_POINT = "sync_after_call"

# ----------------------------------------------------------------------------- the batch


@dataclass(frozen=True)
class Planned:
    """One job of the story: what to submit, how the simulator treats it, what must happen."""

    name: str
    kind: str
    model: str
    input: Mapping[str, Any]
    credits: int
    expect: str  # completed | failed:<code> | uncertain
    timeline: tuple[tuple[float, str], ...] = ()  # real seconds after create (async kinds)
    outputs: int = 1
    create: str = "accept"
    webhook: bool = False
    crash: bool = False  # sync: the request process dies after the provider answered
    user: int = 0  # which demo user pays


def _done_at(seconds: float) -> tuple[tuple[float, str], ...]:
    return ((0.0, "queued"), (min(0.4, seconds / 2), "running"), (seconds, "succeeded"))


QUICK, LONG = 2.0, 9.0  # real seconds until the provider finishes
_PROMPT = {"prompt": "a lighthouse at dusk"}
_DUB = {"source_url": "https://media.example/talk.mp4", "target_lang": "es"}


def batch() -> list[Planned]:
    """The mixed batch: quick jobs finish before the crash, long ones are in flight when worker
    A dies and must be resumed through the sweep."""
    ok = "completed"
    return [
        Planned("market quick x2", "kie-standard", "seedream/4.5-edit", _PROMPT, 40, ok,
                _done_at(QUICK), outputs=2),
        Planned("market quick", "kie-standard", "nano-banana", _PROMPT, 20, ok, _done_at(QUICK)),
        Planned("market long", "kie-standard", "flux-2-pro", _PROMPT, 30, ok, _done_at(LONG)),
        Planned("market fails", "kie-standard", "seedream/4.5", _PROMPT, 25, "failed:UPSTREAM_FAILED",
                ((0.0, "queued"), (0.3, "running"), (1.5, "failed"))),
        Planned("market dropped", "kie-standard", "gpt-image-1", _PROMPT, 35, "uncertain",
                _done_at(QUICK), create="drop_after_accept", user=1),
        Planned("veo quick+hook", "kie-veo", "veo3_fast", _PROMPT, 60, ok, _done_at(QUICK),
                webhook=True),
        Planned("veo long", "kie-veo", "veo3", _PROMPT, 80, ok, _done_at(LONG), user=1),
        Planned("replicate quick x2", "replicate-prediction", "owner/sdxl:abc123", _PROMPT, 15, ok,
                _done_at(QUICK), outputs=2),
        Planned("replicate hook", "replicate-prediction", "owner/flux:def456", _PROMPT, 15, ok,
                _done_at(QUICK), webhook=True),
        Planned("replicate long", "replicate-prediction", "owner/video:987fed", _PROMPT, 50, ok,
                _done_at(LONG), user=1),
        Planned("dubbing quick", "elevenlabs-async", "dubbing", _DUB, 45, ok, _done_at(QUICK)),
        Planned("dubbing long", "elevenlabs-async", "dubbing", _DUB, 45, ok, _done_at(LONG)),
        Planned("fal quick", "fal-queue", "fal-ai/flux/dev", _PROMPT, 10, ok, _done_at(QUICK)),
        Planned("fal hook", "fal-queue", "fal-ai/flux/schnell", _PROMPT, 10, ok, _done_at(QUICK),
                webhook=True),
        Planned("fal long", "fal-queue", "fal-ai/kling-video", _PROMPT, 70, ok, _done_at(LONG),
                user=1),
        Planned("claude", "anthropic-sync", "claude-sonnet-4-5", {"prompt": "haiku"}, 5, ok),
        Planned("claude #2", "anthropic-sync", "claude-haiku-4-5", {"prompt": "limerick"}, 5, ok,
                user=1),
        Planned("claude, request dies", "anthropic-sync", "claude-sonnet-4-5",
                {"prompt": "sonnet"}, 8, "failed:RECONCILE_NO_RECOVERY", crash=True),
        Planned("kie chat", "kie-llm", "gpt-5", {"prompt": "summarise"}, 4, ok),
        Planned("kie chat #2", "kie-llm", "gemini-2.5-pro", {"prompt": "translate"}, 4, ok,
                user=1),
    ]


GRANTS = ((("sub", 600), ("topup", 400)), (("sub", 300), ("topup", 200)))

# ----------------------------------------------------------------------------- processes


class Children:
    """Subprocesses, each the leader of its own process group; :meth:`stop_all` kills the
    groups (SIGTERM, then SIGKILL) and is registered with ``atexit`` — also run on failure."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes] | None]] = []
        self._lock = threading.Lock()

    def spawn(self, name: str, argv: list[str], env: Mapping[str, str],
              log_path: Path | None = None) -> subprocess.Popen[bytes]:
        out = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115
        proc = subprocess.Popen(argv, env=dict(env), stdout=out or subprocess.DEVNULL,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent)
        with self._lock:
            self.procs.append((name, proc, out))
        return proc

    @staticmethod
    def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def stop(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM,
             grace: float = 4.0) -> None:
        if proc.poll() is None:
            self.signal_group(proc, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
        self.signal_group(proc, signal.SIGKILL)  # stragglers of the group, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    def stop_all(self) -> None:
        with self._lock:
            procs, self.procs = self.procs, []
        for _, proc, _ in procs:
            if proc.poll() is None:
                self.signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 4.0
        for _, proc, out in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            self.signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if out is not None:
                out.close()


def _die_with_parent() -> None:
    """Linux: SIGKILL the child if the demo itself is SIGKILLed (no ``finally`` runs then); a
    worker's pool processes exit once their main process is gone."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def worker_argv(name: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "reconcile.celery_app", "worker",
            "--pool=prefork", "-c", "2", "-Q", "reconcile,reconcile.sweep", "-n", f"{name}@demo",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"]


def wait_ready(proc: subprocess.Popen[bytes], log_path: Path, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if b" ready." in log_path.read_bytes():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited early:\n{_tail(log_path)}")
        time.sleep(0.05)
    raise TimeoutError(f"worker not ready in {timeout:.0f}s:\n{_tail(log_path)}")


def _tail(path: Path, size: int = 3000) -> str:
    try:
        return path.read_bytes()[-size:].decode("utf-8", "replace")
    except OSError:
        return ""

# ----------------------------------------------------------------------------- the platform bits


class Printer:
    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def __call__(self, message: str = "", *, stamp: bool = True) -> None:
        line = f"[{self.elapsed():5.1f}s] {message}" if stamp else message
        with self._lock:
            print(line, flush=True)


def start_webhook_endpoint(runtime: dict[str, Any]) -> ThreadingHTTPServer:
    """The platform's webhook route: ``POST /webhooks/<provider>?job_id=…``. It listens at once
    (its URL goes into WEBHOOK_BASE_URL); ``runtime["rt"]`` is set once the runtime exists."""
    from .webhook_ingest import handle_webhook

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            split = urlsplit(self.path)
            provider = split.path.rstrip("/").rsplit("/", 1)[-1]
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                status, answer = handle_webhook(runtime["rt"], provider,
                                                dict(self.headers.items()), body, query)
            except Exception as exc:  # the provider retries on 5xx
                status, answer = 500, {"error": repr(exc)}
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                     name="demo-webhooks", daemon=True).start()
    return server


@dataclass
class Sweeper:
    """Calls the sweep every ``interval`` seconds in a thread; keeps the tick lines."""

    rt: Any
    interval: float
    say: Printer
    fan_out: Callable[[uuid.UUID], None] | None = None
    ticks: list[tuple[float, str, str]] = field(default_factory=list)
    errors: int = 0  # rows a tick could not handle, summed over the ticks
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="demo-sweep", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def tick(self) -> None:
        from .sweep import sweep

        at = self.say.elapsed()
        try:
            report = sweep(self.rt, fan_out=self.fan_out)
            line, notes = report.line(), _summarise(report.actions)
            self.errors += report.errors
        except Exception as exc:  # shown, and the invariants will tell
            line, notes = f"[reconcile] tick failed: {exc!r}", ""
            self.errors += 1
        self.ticks.append((at, line, notes))
        if notes:  # quiet ticks are listed in the summary only
            self.say(f"sweep  {line}  ← {notes}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


def _summarise(actions: Iterable[Any]) -> str:
    counts: dict[str, int] = {}
    for action in actions:
        if action.outcome in ("left", "not_found"):
            continue
        key = f"{action.action}:{action.outcome} ({action.row})"
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{n}× {key}" for key, n in sorted(counts.items()))

# ----------------------------------------------------------------------------- environment


@dataclass
class Setup:
    work: Path
    env: dict[str, str]
    database_url: str
    embedded_db: bool
    embedded_broker: bool


def prepare(work: Path, scale: float, hooks_url: str, sim_env: Mapping[str, str]) -> Setup:
    """The work folder and the RECONCILE_* environment every process of the demo shares."""
    given_db = os.environ.get("RECONCILE_DATABASE_URL")
    given_broker = os.environ.get("RECONCILE_BROKER_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_TEST_")}
    db_url = given_db or f"sqlite:///{work / 'reconcile.db'}"
    env.update(sim_env)
    env.update({
        "RECONCILE_DATABASE_URL": db_url,
        "RECONCILE_BROKER_URL": given_broker or "filesystem://",
        "RECONCILE_BROKER_FOLDER": str(work / "broker"),
        "RECONCILE_STORAGE_URL": f"file://{work / 'media'}",
        "RECONCILE_TIME_SCALE": repr(scale),
        "RECONCILE_SWEEP_INTERVAL": repr(SWEEP_EVERY / scale),
        "RECONCILE_WEBHOOK_BASE_URL": hooks_url,
        "PYTHONUNBUFFERED": "1",
    })
    # loopback only: never through a proxy
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return Setup(work, env, db_url, given_db is None, given_broker is None)


MARKER = ".reconcile-demo"  # a work folder the demo made (and may wipe)


def wipe(work: Path) -> None:
    """Empty the work folder — only if the demo made it (or it is empty): ``--workdir .`` must
    never delete someone's files."""
    if work.exists() and any(work.iterdir()) and not (work / MARKER).exists():
        raise SystemExit(f"refusing to wipe {work}: not a folder the demo created "
                         f"(no {MARKER} file); pick another --workdir")
    if work.exists():
        shutil.rmtree(work)
    for sub in ("broker/queue", "broker/control", "media", "logs"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    (work / MARKER).touch()

# ----------------------------------------------------------------------------- the story


@dataclass
class Story:
    plans: list[Planned]
    ids: list[uuid.UUID]
    users: list[uuid.UUID]
    crash_rc: int | None = None
    worker_b_rc: int | None = None  # None: worker B was still alive at the end
    in_flight_at_crash: list[uuid.UUID] = field(default_factory=list)
    sync_rcs: dict[str, int | None] = field(default_factory=dict)

    def by_id(self) -> dict[uuid.UUID, Planned]:
        return dict(zip(self.ids, self.plans, strict=True))


def snapshot(rt: Any, ids: list[uuid.UUID]) -> dict[uuid.UUID, Any]:
    from sqlalchemy import select

    from .db.models import Job

    with rt.sessions() as session:
        return {j.id: j for j in session.execute(select(Job).where(Job.id.in_(ids))).scalars()}


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    say = Printer(t0)
    children = Children()
    atexit.register(children.stop_all)
    work = Path(args.workdir).resolve()
    wipe(work)
    logs = work / "logs"
    scale = float(args.time_scale)

    from .testing.simulator import Script, Simulator

    sim = Simulator(time_scale=scale).start()
    hooks: ThreadingHTTPServer | None = None
    sweeper: Sweeper | None = None
    try:
        runtime: dict[str, Any] = {}
        hooks = start_webhook_endpoint(runtime)
        hooks_url = f"http://127.0.0.1:{hooks.server_address[1]}"
        setup = prepare(work, scale, hooks_url, sim.env())
        os.environ.update({k: v for k, v in setup.env.items() if k.startswith("RECONCILE_")})
        os.environ.update(NO_PROXY=setup.env["NO_PROXY"], no_proxy=setup.env["no_proxy"])

        from . import credits, tasks
        from .celery_app import app
        from .db.migrate import upgrade
        from .db.session import normalise_url

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
        runtime["rt"] = rt
        say("migrated; simulator and webhook endpoint up")

        plans = batch()
        story = Story(plans, [uuid.uuid4() for _ in plans], [uuid.uuid4() for _ in GRANTS])
        with rt.sessions.begin() as session:
            for user, grants in zip(story.users, GRANTS, strict=True):
                for pool, amount in grants:
                    credits.grant(session, user, pool, amount, f"demo-grant:{user}:{pool}")
        say(f"granted credits to {len(story.users)} users: "
            + "; ".join(f"{str(u)[:8]} sub {g[0][1]} + topup {g[1][1]}"
                        for u, g in zip(story.users, GRANTS, strict=True)))

        # worker A, with a once-only mid-poll crash: the marker file exists = disarmed
        marker = work / "crash-once.marker"
        marker.touch()
        env_a = {**setup.env, "RECONCILE_TEST_CRASH_AT": CRASH_POINT,
                 "RECONCILE_TEST_CRASH_ONCE": str(marker), "RECONCILE_TEST_CRASH_MODE": "group"}
        worker_a = children.spawn("worker A", worker_argv("A"), env_a, logs / "worker-A.log")
        wait_ready(worker_a, logs / "worker-A.log")
        say(f"worker A ready (pid {worker_a.pid}, prefork -c 2, own process group)")

        sweeper = Sweeper(rt, SWEEP_EVERY, say,
                          fan_out=lambda job_id: tasks.reconcile_job.delay(str(job_id)))
        submit_all(rt, sim, story, Script)
        say(f"submitted {len(plans)} jobs "
            f"({sum(not rt.kind(p.kind).sync for p in plans)} async via worker creates, "
            f"{sum(rt.kind(p.kind).sync for p in plans)} sync via the request process)")
        requests_done = start_requests(children, setup, story, logs, say)
        sweeper.start()

        # wait for every create to be decided and the quick jobs to finish, then crash worker A
        by_id = story.by_id()
        async_ids = [i for i in story.ids if not rt.kind(by_id[i].kind).sync]
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
        marker.unlink()
        say(f"armed the once-only '{CRASH_POINT}' crash in worker A "
            f"({len(story.in_flight_at_crash)} jobs have live poll chains)")
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker_a.wait(timeout=15)
        story.crash_rc = worker_a.poll()
        children.signal_group(worker_a, signal.SIGKILL)  # nothing of A survives, whatever happened
        if story.crash_rc is None:
            say("!! worker A did not crash")
            worker_a.wait(timeout=5)
        else:
            say(f"worker A died mid-poll: whole process group SIGKILLed (exit {story.crash_rc}); "
                + ("the poll messages it held are gone: the filesystem broker never redelivers"
                   if setup.embedded_broker else
                   "the broker would return its unacked messages only after the visibility "
                   "timeout"))

        worker_b = children.spawn("worker B", worker_argv("B"), setup.env, logs / "worker-B.log")
        wait_ready(worker_b, logs / "worker-B.log")
        say(f"worker B ready (pid {worker_b.pid}); the sweep resumes chains whose poll lease expired")

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
        sweeper.tick()  # one last tick after the dust settles: it must change nothing
        story.worker_b_rc = worker_b.poll()
        for name, proc, _ in list(children.procs):
            if name.startswith("worker"):  # cold shutdown: nothing is left to finish
                children.stop(proc, signal.SIGQUIT, grace=1.5)
        say("workers stopped")
        for name, proc, _ in list(children.procs):
            if name.startswith("request"):
                story.sync_rcs[name] = proc.poll()

        show_uncertain(setup, uncertain_ids, say)
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
        children.stop_all()
        if hooks is not None:
            with contextlib.suppress(Exception):
                hooks.shutdown()
                hooks.server_close()
        sim.stop()


def broker_backlog(app: Any, say: Printer, *, purge: bool) -> None:
    """A given broker is never wiped; messages left in its queues (by earlier runs, or by
    workers that died or were stopped holding them) run before this run's and only slow it down
    (each one is fenced or finds its job finished). ``--purge-broker`` empties the two queues."""
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        for queue in ("reconcile", "reconcile.sweep"):
            try:
                waiting = channel.queue_declare(queue=queue, passive=True).message_count
            except Exception:  # not declared yet
                continue
            if waiting and purge:
                channel.queue_purge(queue)
                say(f"purged {waiting} old messages from queue {queue!r} (--purge-broker)")
            elif waiting:
                say(f"note: queue {queue!r} already holds {waiting} messages; they run first "
                    f"(--purge-broker empties it)")


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@")
    return url


def _count(values: Iterable[Any]) -> str:
    counts: dict[str, int] = {}
    for value in values:
        counts[str(value)] = counts.get(str(value), 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))


def submit_all(rt: Any, sim: Any, story: Story, script_cls: Any) -> None:
    from .lifecycle import submit_job

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


def _is_sync(kind: str) -> bool:
    from .kinds import get_kind

    found = get_kind(kind)
    return bool(found and found.sync)


def request_process(job_ids: list[str]) -> int:
    """``--request``: what the platform's request handler does for a sync kind."""
    from . import tasks
    from .sync import run_sync

    rt = tasks.get_runtime()  # installs the crash hook when RECONCILE_TEST_CRASH_AT is set
    for job_id in job_ids:
        job = run_sync(rt, uuid.UUID(job_id))
        print(f"request job={job_id} status={job.status} code={job.error_code}", flush=True)
    return 0

# ----------------------------------------------------------------------------- report + checks


def show_uncertain(setup: Setup, uncertain_ids: list[uuid.UUID], say: Printer) -> None:
    """The operator's view: ``python -m reconcile uncertain`` (or the same query, if the CLI is
    not installed)."""
    say("operator view of uncertain submissions:")
    if importlib.util.find_spec("reconcile.cli") is not None and \
            importlib.util.find_spec("reconcile.__main__") is not None:
        try:
            out = subprocess.run([sys.executable, "-m", "reconcile", "uncertain"], env=setup.env,
                                 capture_output=True, text=True, timeout=60)
            if out.returncode == 0:
                say("$ python -m reconcile uncertain", stamp=False)
                say(out.stdout.rstrip(), stamp=False)
                return
            say(f"(reconcile uncertain exited {out.returncode}: {out.stderr.strip()[-300:]})")
        except (OSError, subprocess.TimeoutExpired) as exc:
            say(f"(reconcile uncertain failed: {exc!r})")
    from sqlalchemy import select

    from . import tasks
    from .db.models import Job, UsageLog

    rt = tasks.get_runtime()
    say("$ SELECT … FROM jobs WHERE submission_state = 'uncertain'  (CLI not available)",
        stamp=False)
    with rt.sessions() as session:
        rows = session.execute(
            select(Job, UsageLog).join(UsageLog, UsageLog.job_id == Job.id, isouter=True)
            .where(Job.submission_state == "uncertain", Job.status.in_(["pending", "processing"]))
            .order_by(Job.created_at)).all()
    for job, log in rows:
        mine = " (this run)" if job.id in uncertain_ids else ""
        say(f"  {job.id}  {job.provider_kind:<14} {job.status}/{job.submission_state}  "
            f"{job.error_code}  reserved={log.credits if log else '-'} ({log.status if log else '-'})"
            f"  since {job.provider_call_started_at:%H:%M:%S}{mine}", stamp=False)


@dataclass
class Row:
    job_id: uuid.UUID
    plan: Planned
    status: str
    submission: str | None
    code: str | None
    creates: str
    reserved: int
    committed: int
    refunded: int
    how: str


def how_settled(job: Any, via: str | None) -> str:
    if job.status in ("pending", "processing"):
        return "left-uncertain" if job.submission_state == "uncertain" else "STILL IN FLIGHT"
    detail = job.error_detail if isinstance(job.error_detail, dict) else {}
    source = via or detail.get("via")
    if job.status == "failed" and detail.get("via") == "sweep":
        return "refunded-by-sweep"
    if source == "webhook":
        return "webhook"
    if source == "sync":
        return "request"
    if source == "sweep":
        return "sweep-poll"
    return "sweep-resumed" if (job.poll_generation or 0) >= 2 else "worker"


def report(rt: Any, sim: Any, story: Story, sweeper: Sweeper, say: Printer) -> list[str]:
    from sqlalchemy import select

    from . import credits
    from .db.models import Asset, CreditTransaction, JobEvent, UsageLog

    failures: list[str] = []
    by_id = story.by_id()
    jobs = snapshot(rt, story.ids)
    with rt.sessions() as session:
        logs = {u.job_id: u for u in session.execute(
            select(UsageLog).where(UsageLog.job_id.in_(story.ids))).scalars()}
        txns: dict[uuid.UUID, list[Any]] = {}
        for t in session.execute(select(CreditTransaction)
                                 .where(CreditTransaction.job_id.in_(story.ids))).scalars():
            txns.setdefault(t.job_id, []).append(t)
        assets: dict[uuid.UUID, list[Any]] = {}
        for a in session.execute(select(Asset).where(Asset.job_id.in_(story.ids))).scalars():
            assets.setdefault(a.job_id, []).append(a)
        vias = {e.job_id: (e.payload or {}).get("via") for e in session.execute(
            select(JobEvent).where(JobEvent.job_id.in_(story.ids),
                                   JobEvent.type == "completed")).scalars()}
        discrepancies = credits.audit(session, now=rt.now(), settings=rt.settings)
    users, ids = set(story.users), set(story.ids)
    discrepancies = [d for d in discrepancies if d.user_id in users or d.job_id in ids]

    # sync calls carry no job id upstream: the simulator counts them per provider
    sync_calls: dict[str, int] = {}
    for entry in sim.counters()["creates"]:
        if entry["job_id"] is None:
            sync_calls[entry["provider"]] = sync_calls.get(entry["provider"], 0) + entry["count"]
    sync_jobs: dict[str, int] = {}
    for plan in story.plans:
        if _is_sync(plan.kind):
            sync_jobs[_provider(plan.kind)] = sync_jobs.get(_provider(plan.kind), 0) + 1

    rows: list[Row] = []
    for job_id in story.ids:
        plan, job = by_id[job_id], jobs.get(job_id)
        if job is None:
            failures.append(f"{plan.name}: job row missing")
            continue
        amounts = {t.type: t.amount for t in txns.get(job_id, []) if t.id.endswith(str(job_id))}
        refunded = sum(t.amount for t in txns.get(job_id, []) if t.type == "REFUND")
        log = logs.get(job_id)
        if _is_sync(plan.kind):
            creates = f"{sync_calls.get(_provider(plan.kind), 0)}/{sync_jobs[_provider(plan.kind)]}ˢ"
        else:
            creates = str(sim.creates(str(job_id)))
        rows.append(Row(job_id, plan, job.status, job.submission_state, job.error_code, creates,
                        log.credits if log else 0, amounts.get("COMMIT", 0), refunded,
                        how_settled(job, vias.get(job_id))))
        failures.extend(check(plan, job, log, assets.get(job_id, []), refunded, sim, rt))

    for provider, calls in sorted(sync_calls.items()):
        if calls > sync_jobs.get(provider, 0):
            failures.append(f"{provider}: {calls} sync calls for {sync_jobs.get(provider, 0)} jobs")
    if story.crash_rc != -signal.SIGKILL:
        failures.append(f"worker A was not SIGKILLed mid-poll (exit {story.crash_rc})")
    for name, rc in story.sync_rcs.items():
        want = -signal.SIGKILL if "dies" in name else 0
        if rc != want:
            failures.append(f"{name} process: exit {rc}, expected {want}")
    if story.worker_b_rc is not None:
        failures.append(f"worker B exited on its own (exit {story.worker_b_rc}): see its log")
    resumed = [r for r in rows if r.job_id in story.in_flight_at_crash
               and (jobs[r.job_id].poll_generation or 0) >= 2]
    if not resumed:
        failures.append("no poll chain that died with worker A was resumed by the sweep")
    if discrepancies:
        failures.extend(f"audit: {d.kind} {d.detail}" for d in discrepancies)
    if sweeper.errors:
        failures.append(f"the sweep reported {sweeper.errors} errors")
    if sweeper.ticks and sweeper.ticks[-1][2]:
        failures.append(f"the last tick, after everything settled, still acted: {sweeper.ticks[-1][2]}")

    print_table(rows, say)
    say("ˢ sync calls carry no job id upstream: calls/jobs per provider ("
        + ", ".join(f"{p} {sync_calls.get(p, 0)}/{n}" for p, n in sorted(sync_jobs.items()))
        + ")", stamp=False)
    say(f"in flight when worker A died: {len(story.in_flight_at_crash)} jobs; chains resumed by "
        f"the sweep and finished on worker B: {len(resumed)} (a chain whose next poll was still "
        f"waiting in the broker, not yet fetched by A, simply continues on B)", stamp=False)
    say("", stamp=False)
    say(f"sweep ticks ({len(sweeper.ticks)}):", stamp=False)
    for at, line, notes in sweeper.ticks:
        say(f"  {at:5.1f}s  {line}{'  ← ' + notes if notes else ''}", stamp=False)
    say("", stamp=False)
    total = {k: sum(getattr(r, k) for r in rows) for k in ("reserved", "committed", "refunded")}
    held = sum(r.reserved for r in rows if r.status == "pending")
    say(f"credits: reserved {total['reserved']} = committed {total['committed']} + refunded "
        f"{total['refunded']} + still held {held} (the uncertain job)", stamp=False)
    if total["reserved"] != total["committed"] + total["refunded"] + held:
        failures.append("credits do not add up: reserved != committed + refunded + held")
    if discrepancies:
        say(f"ledger audit: {len(discrepancies)} discrepancies", stamp=False)
    else:
        say(f"ledger audit: clean (credits.audit == [] over {len(users)} users, "
            f"{len(story.ids)} jobs)", stamp=False)
    return failures


def _provider(kind: str) -> str:
    from .kinds import provider_of

    return provider_of(kind) or kind


def check(plan: Planned, job: Any, log: Any, assets: list[Any], refunded: int, sim: Any,
          rt: Any) -> list[str]:
    """The invariants of one job; returns what is broken (empty: all hold)."""
    name = f"{plan.name} ({str(job.id)[:8]})"
    broken: list[str] = []
    if not _is_sync(plan.kind):
        creates, attempts = sim.creates(str(job.id)), sim.attempts(str(job.id))
        if creates > 1:
            broken.append(f"{name}: created {creates} times upstream")
        if plan.expect == "uncertain" and attempts != 1:
            broken.append(f"{name}: uncertain job was submitted {attempts} times")
    if log is None:
        return [*broken, f"{name}: no usage log"]
    if plan.expect == "uncertain":
        if (job.status, job.submission_state) != ("pending", "uncertain"):
            broken.append(f"{name}: expected pending/uncertain, got {job.status}/{job.submission_state}")
        if log.status != "reserved" or job.credits_actual is not None or refunded:
            broken.append(f"{name}: the uncertain job's reservation is not intact ({log.status})")
        return broken
    expected_status, _, expected_code = plan.expect.partition(":")
    if job.status != expected_status or (expected_code and job.error_code != expected_code):
        broken.append(f"{name}: expected {plan.expect}, got {job.status} {job.error_code or ''} "
                      f"{job.error_message or ''}".rstrip())
    if job.status == "completed":
        outputs = (job.output_data or {}).get("outputs") or []
        want = plan.outputs if not _is_sync(plan.kind) and plan.kind != "elevenlabs-async" else None
        if len(assets) != len(outputs) or not assets or (want is not None and len(assets) != want):
            broken.append(f"{name}: {len(assets)} asset rows for {len(outputs)} outputs "
                          f"(expected {want if want is not None else len(outputs)})")
        if sorted(a.index for a in assets) != list(range(len(assets))):
            broken.append(f"{name}: asset indexes {sorted(a.index for a in assets)}")
        missing = [a.storage_key for a in assets if not rt.storage.exists(a.storage_key)]
        if missing:
            broken.append(f"{name}: stored objects missing: {missing}")
        if log.status != "committed" or job.credits_actual != log.credits:
            broken.append(f"{name}: completed but usage log {log.status}, "
                          f"credits_actual {job.credits_actual}")
    elif job.status == "failed":
        if job.credits_actual != 0 or log.status != "refunded" or refunded != log.credits:
            broken.append(f"{name}: failed but not refunded (credits_actual {job.credits_actual}, "
                          f"log {log.status}, refunded {refunded}/{log.credits})")
    else:
        broken.append(f"{name}: not terminal ({job.status}/{job.submission_state})")
    return broken


def print_table(rows: list[Row], say: Printer) -> None:
    header = ("job", "kind", "story", "outcome", "error code", "creates", "reserved",
              "committed", "refunded", "settled by")
    cells = [header] + [
        (str(r.job_id)[:8], r.plan.kind, r.plan.name,
         r.status if r.submission not in ("uncertain",) else f"{r.status}/{r.submission}",
         r.code or "-", r.creates, str(r.reserved), str(r.committed), str(r.refunded), r.how)
        for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    numeric = {5, 6, 7, 8}

    def fmt(cols: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cols, widths, strict=True))).rstrip()

    say("", stamp=False)
    say(fmt(header), stamp=False)
    say("  ".join("-" * w for w in widths), stamp=False)
    for row in cells[1:]:
        say(fmt(row), stamp=False)

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


if __name__ == "__main__":
    raise SystemExit(main())
