"""Internal: the library's own mechanics, not an import path for platforms (may move).

The explorer's writers, starting states, scenarios and invariants.

A *writer* is one real library entry point called the way a worker, the beat, the platform's
request or an operator calls it. A *scenario* pairs two writers on one job from a starting state
built with the real lifecycle (submitted, accepted, uncertain, failed-but-unsettled, a sync job,
a platform row), plus the deadlines a clock jump may pass. Providers are the shipped simulator
over loopback (Replicate for the async kinds: it has a cancel endpoint and a listing, so
evidence and upstream cancels are real; Anthropic for the sync kinds).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sqlalchemy import func, select

from .. import batch_poll, credits, jobstore, lifecycle
from ..db.models import CreditTransaction, Job, JobEvent, WorkflowExecution
from ..settlement import SettleOutcome
from ..states import (
    ATTEMPT_SPACING,
    CREATE_CLAIM_LEASE,
    IN_FLIGHT,
    MAX_ATTEMPTS,
    NOT_STARTED_AGE,
    TERMINAL,
    Status,
    Submission,
)
from .explorer import START, Context, Scenario, Writer
from .simulator import Script

ASYNC_KIND, ASYNC_MODEL, ASYNC_INPUT = "replicate-prediction", "owner/model:abc123", {"prompt": "x"}
SYNC_KIND, SYNC_MODEL, SYNC_INPUT = "anthropic-sync", "claude-sonnet-4-5", {"prompt": "hi"}
CREDITS = 40
NODE = "n1"
SUCCEEDS = Script(timeline=((0.0, "succeeded"),))  # done upstream at once
SUCCEEDS_LATER = Script(timeline=((0.0, "running"), (10.0, "succeeded")))

# deadlines, as offsets from the schedule's start (the explorer passes each by one second)
CLAIM = CREATE_CLAIM_LEASE
POLL_LEASE = timedelta(seconds=21)  # replicate: 2 × 3 s + 15 s slack
SETTLE_GRACE = timedelta(seconds=30)
NODE_TIMEOUT = timedelta(minutes=90)
REPLICATE_THRESHOLD = timedelta(minutes=20)
SYNC_THRESHOLD = timedelta(minutes=5)


# RECONCILE_POLL_MODE=batch: reads inline (one thread) so the writer's steps stay its own
BATCH = (("poll_mode", "batch"), ("poll_batch_threads", 1))
# a batch claim's lease: a status read's total deadline (4 × 35 s + 3 × 30 s) + 15 s slack
BATCH_LEASE = timedelta(seconds=245)


class _Crash(Exception):
    """A worker dying at a named crash point during setup (the state it leaves is the start)."""


# ----------------------------------------------------------------------------- setups


def fund(rt: Any, ctx: Context) -> None:
    with rt.sessions.begin() as session:
        credits.grant(session, ctx.user_id, "sub", 1000, "explorer-grant", now=START)


def _submit(rt: Any, ctx: Context, *, kind: str = ASYNC_KIND, script: Script = SUCCEEDS,
            workflow: bool = False) -> None:
    model, input_ = (SYNC_MODEL, SYNC_INPUT) if kind == SYNC_KIND else (ASYNC_MODEL, ASYNC_INPUT)
    ctx.sim.script(str(ctx.job_id), script)
    execution = None
    if workflow:
        execution = uuid.uuid5(ctx.job_id, "execution")
        with rt.sessions.begin() as session:
            session.add(WorkflowExecution(id=execution, status="running", failed_nodes=[]))
    lifecycle.submit_job(rt, ctx.user_id, kind, model, input_, CREDITS, job_type="image",
                         job_id=ctx.job_id, workflow_execution_id=execution,
                         node_id=NODE if workflow else None)
    ctx.explorer.queues.clear()  # the writers are the workers now


def submitted(script: Script = SUCCEEDS_LATER) -> Callable[[Any, Context], None]:
    """pending / not_started, the create message not yet run; upstream the task will still be
    running when the create answers (so an upstream cancel is real)."""
    return lambda rt, ctx: _submit(rt, ctx, script=script)


def accepted(script: Script = SUCCEEDS, *, workflow: bool = False) -> Callable[[Any, Context], None]:
    """processing / accepted, its first poll message pending (the poll writer runs it)."""
    def setup(rt: Any, ctx: Context) -> None:
        _submit(rt, ctx, script=script, workflow=workflow)
        lifecycle.create_step(rt, ctx.job_id)
        queues = ctx.explorer.queues
        ctx.facts["poll"] = queues.polls.popleft()[1:]
        queues.clear()
    return setup


def batch_accepted(script: Script = SUCCEEDS) -> Callable[[Any, Context], None]:
    """processing / accepted in batch mode: no poll message, the row due now (poll_due_at)."""
    def setup(rt: Any, ctx: Context) -> None:
        _submit(rt, ctx, script=script)
        lifecycle.create_step(rt, ctx.job_id)
        assert not ctx.explorer.queues.polls, "batch mode sends no poll message"
        with rt.sessions.begin() as session:
            jobstore.make_due_at(session, ctx.job_id, ctx.clock.now)
        ctx.explorer.queues.clear()
    return setup


def uncertain(rt: Any, ctx: Context) -> None:
    """pending / uncertain: the connection dropped after the provider accepted the create."""
    _submit(rt, ctx, script=Script(timeline=((0.0, "succeeded"),), create="drop_after_accept"))
    lifecycle.create_step(rt, ctx.job_id)
    ctx.explorer.queues.clear()


def failed_unsettled(rt: Any, ctx: Context) -> None:
    """failed, refund pending: the worker died between persisting the failure and the refund."""
    _submit(rt, ctx, script=Script(timeline=((0.0, "failed"),)))
    lifecycle.create_step(rt, ctx.job_id)
    generation, seq = ctx.explorer.queues.polls.popleft()[1:]

    def crash(point: str) -> None:
        if point == "before_refund":
            raise _Crash(point)
    rt.crash_hook = crash
    try:
        lifecycle.poll_step(rt, ctx.job_id, generation, seq)
    except _Crash:
        pass
    finally:
        rt.crash_hook = None
    ctx.explorer.queues.clear()


def sync_submitted(rt: Any, ctx: Context) -> None:
    """A sync-kind job: pending / not_started, waiting for the platform's request to call."""
    _submit(rt, ctx, kind=SYNC_KIND)


def sync_claimed_dead(rt: Any, ctx: Context) -> None:
    """A sync-kind job whose request took the submission claim, then its process died."""
    from ..sync import _claim

    _submit(rt, ctx, kind=SYNC_KIND)
    _claim(rt, ctx.job_id, None)


def platform_row(rt: Any, ctx: Context) -> None:
    """A platform row the library never submitted (no submission_state), credits reserved."""
    with rt.sessions.begin() as session:
        jobstore.insert_job(session, id=ctx.job_id, user_id=ctx.user_id, job_type="chat",
                            status=Status.PENDING, input_data=dict(SYNC_INPUT), progress=0,
                            created_at=START)
        session.flush()
        credits.reserve(session, ctx.user_id, ctx.job_id, CREDITS, now=START)


# ----------------------------------------------------------------------------- writers


def _create(rt: Any, ctx: Context) -> str:
    return lifecycle.create_step(rt, ctx.job_id).action


def _poll(rt: Any, ctx: Context) -> str:
    generation, seq = ctx.facts["poll"]
    return lifecycle.poll_step(rt, ctx.job_id, generation, seq)


def _poll_due(rt: Any, ctx: Context) -> str:
    """One ``reconcile.poll_due`` run: claim the due rows, read, write (reconcile.batch_poll)."""
    report = batch_poll.poll_due(rt, budget=3600.0)
    outcomes = ",".join(f"{k}={v}" for k, v in sorted(report.outcomes.items()))
    return f"claimed={report.claimed} fenced={report.fenced} {outcomes}".strip()


def _sweep(rt: Any, ctx: Context) -> str:
    from ..sweep import sweep

    report = sweep(rt)
    return ",".join(f"{a.row}:{a.outcome}" for a in report.actions) or "nothing"


def _sweep_twice(rt: Any, ctx: Context) -> str:
    """Two beat ticks, time passing in between (a sleep point)."""
    first = _sweep(rt, ctx)
    ctx.sleep()
    return f"{first} | {_sweep(rt, ctx)}"


def _task(ctx: Context) -> Any:
    tasks = ctx.sim.tasks_for(str(ctx.job_id))
    return tasks[0] if tasks else None


def _webhook(rt: Any, ctx: Context) -> str:
    """The provider's signed delivery for the job's upstream task, through handle_webhook."""
    from ..webhook_ingest import handle_webhook
    from . import sim_replicate
    from .sim_signing import replicate_headers

    task = ctx.wait_for(lambda: _task(ctx))
    if task is None:
        return "no upstream task"
    found = ctx.sim.lookup(task.task_id)
    if found is None:
        return "vanished"
    body = json.dumps(sim_replicate.render(ctx.sim, *found), separators=(",", ":")).encode()
    headers = replicate_headers(ctx.sim.secrets.replicate_webhook_secret, body,
                                f"msg_{task.task_id}", int(ctx.clock.now.timestamp()))
    query = {k: v[-1] for k, v in parse_qs(urlsplit(task.callback_url or "").query).items()}
    status, answer = handle_webhook(rt, "replicate", headers, body, query)
    return f"{status} {answer.get('status')}"


def _cancel(rt: Any, ctx: Context) -> str:
    """The user's cancel through the gateway helper (200 / 404 / 409)."""
    from .. import api

    status, body = api.cancel(rt, ctx.user_id, ctx.job_id)
    error = body.get("error") if isinstance(body, dict) else None
    return f"{status} {error.get('code') if isinstance(error, dict) else body.get('state')}"


def _cli(rt: Any, *args: str) -> str:
    """The operator CLI, invoked as `reconcile …` would be (in-process, on this runtime)."""
    import click

    from ..cli import main

    try:
        main.main(list(args), obj=rt, standalone_mode=False)
        return "ok"
    except click.exceptions.Exit as exc:
        return f"exit {exc.exit_code}"
    except click.ClickException as exc:
        return f"refused: {exc.format_message()[:60]}"


def _fail(rt: Any, ctx: Context) -> str:
    return _cli(rt, "fail", str(ctx.job_id), "--reason", "explorer")


def _resolve_upstream(rt: Any, ctx: Context) -> str:
    """The operator adopts the upstream id they found at the provider (once it exists)."""
    task = ctx.wait_for(lambda: _task(ctx))
    if task is None:
        return "no upstream task to adopt"
    return _cli(rt, "resolve", str(ctx.job_id), "--upstream-id", task.task_id)


def _resolve_not_submitted(rt: Any, ctx: Context) -> str:
    return _cli(rt, "resolve", str(ctx.job_id), "--not-submitted")


def _settle(rt: Any, ctx: Context) -> str:
    return "settled" if lifecycle.settle(rt, ctx.job_id) is SettleOutcome.SETTLED else "nothing"


def _wait(rt: Any, ctx: Context) -> str:
    from ..orchestrator import NodeTimeout, wait_for_job

    try:
        return wait_for_job(rt, ctx.job_id, clock=rt.clock, sleep=ctx.sleep)
    except NodeTimeout:
        return "node_timeout"


def _paid(ctx: Context) -> None:
    ctx.facts["paid_calls"] = ctx.facts.get("paid_calls", 0) + 1


def _sync(rt: Any, ctx: Context) -> str:
    """The platform's request running a sync-kind job's call (``sync_call`` + the client)."""
    from ..errors import Conflict, ProviderError
    from ..providers.base import SyncProvider
    from ..sync import sync_call

    client = rt.client(rt.kind(SYNC_KIND))
    assert isinstance(client, SyncProvider)
    try:
        with sync_call(rt, ctx.job_id) as call:
            _paid(ctx)
            call.result = client.call(SYNC_MODEL, SYNC_INPUT)
    except Conflict as exc:
        return f"409 {exc.code}"
    except ProviderError as exc:
        return f"failed {exc.code}"
    return "called"


def _sync_platform(rt: Any, ctx: Context) -> str:
    """The same on a platform row: ``sync_call(provider_kind=…)`` marks the call start."""
    from ..errors import Conflict, ReconcileError
    from ..providers.base import SyncProvider
    from ..sync import sync_call

    client = rt.client(rt.kind(SYNC_KIND))
    assert isinstance(client, SyncProvider)
    try:
        with sync_call(rt, ctx.job_id, provider_kind=SYNC_KIND) as call:
            _paid(ctx)
            call.result = client.call(SYNC_MODEL, SYNC_INPUT)
    except Conflict as exc:
        return f"409 {exc.code}"
    except ReconcileError as exc:
        return f"refused {type(exc).__name__}"
    return "called"


CREATE = Writer("create", _create)
POLL = Writer("poll", _poll)
POLL_DUE = Writer("poll_due", _poll_due)
SWEEP = Writer("sweep", _sweep)
SWEEP2 = Writer("sweep×2", _sweep_twice)
WEBHOOK = Writer("webhook", _webhook)
CANCEL = Writer("cancel", _cancel)
FAIL = Writer("fail", _fail)
RESOLVE_UPSTREAM = Writer("resolve_upstream", _resolve_upstream)
RESOLVE_NOT_SUBMITTED = Writer("resolve_not_submitted", _resolve_not_submitted)
SETTLE = Writer("settle", _settle)
WAIT = Writer("wait_for_job", _wait)
SYNC = Writer("sync_call", _sync)
SYNC_PLATFORM = Writer("sync_call(platform)", _sync_platform)


# ----------------------------------------------------------------------------- invariants


def _events(session: Any, job_id: uuid.UUID) -> list[str]:
    return list(session.execute(select(JobEvent.type).where(JobEvent.job_id == job_id)
                                .order_by(JobEvent.id)).scalars())


def _txn_ids(session: Any, job_id: uuid.UUID) -> set[str]:
    return set(session.execute(select(CreditTransaction.id)
                               .where(CreditTransaction.job_id == job_id)).scalars())


def _upstream_calls(ctx: Context, job: Job) -> int:
    if job.provider_kind == SYNC_KIND or job.submission_state is None:
        return int(ctx.facts.get("paid_calls", 0))
    return ctx.sim.creates(str(ctx.job_id))


def check(rt: Any, ctx: Context, scenario: Scenario, phase: str, *, final: bool = False) -> list[str]:
    """The invariants on the scenario's job (``final``: also settlement, liveness, audit)."""
    found: list[str] = []
    with rt.sessions() as session:
        job = jobstore.load(session, ctx.job_id)
        if job is None:
            return [f"job_missing ({phase})"]
        events = _events(session, ctx.job_id)
        txns = _txn_ids(session, ctx.job_id)
        execution = (session.get(WorkflowExecution, job.workflow_execution_id)
                     if job.workflow_execution_id else None)
        audit = credits.audit(session, now=ctx.clock.now) if final else []
    calls = _upstream_calls(ctx, job)
    if calls > 1:
        found.append(f"two_creates: {calls} upstream creates/calls ({phase})")
    completions = events.count("completed")
    if completions > 1:
        found.append(f"two_completions: {completions} completed events ({phase})")
    if (job.status == Status.COMPLETED and "canceled" in events) or \
            (job.status == Status.CANCELLED and completions):
        found.append(f"completed_after_cancel: status {job.status}, events {events} ({phase})")
    for task in ctx.sim.tasks_for(str(ctx.job_id)):
        if task.forced and task.forced[1] == "canceled" and task.task_id == job.provider_task_id \
                and job.status != Status.CANCELLED:
            found.append(f"polled_task_cancelled: upstream {task.task_id} cancelled while the job "
                         f"polls it (job {job.status}) ({phase})")
    commit, refund = credits.commit_txn_id(ctx.job_id) in txns, credits.refund_txn_id(ctx.job_id) in txns
    if commit and refund:
        found.append(f"settled_twice: commit and refund ({phase})")
    if execution is not None and execution.status == "failed" and job.status == Status.COMPLETED \
            and _nodes(execution.failed_nodes) == [job.node_id]:
        found.append(f"node_failed_but_job_completed: execution failed {execution.failed_nodes} "
                     f"while job {job.node_id} completed ({phase})")
    if ctx.facts.get("paid_calls") and job.status == Status.CANCELLED:
        found.append(f"paid_call_for_cancelled_job ({phase})")
    if final:
        found += _final(job, commit, refund, audit, phase)
    for extra in scenario.extra_checks:
        found += extra(rt, ctx, phase)
    return found


def _final(job: Job, commit: bool, refund: bool, audit: Sequence[Any], phase: str) -> list[str]:
    found = []
    if job.status == Status.COMPLETED and not commit:
        found.append(f"unsettled: completed without a commit ({phase})")
    if job.status in (Status.FAILED, Status.CANCELLED) and (not refund or job.credits_actual is None):
        found.append(f"unsettled: {job.status} without its refund ({phase})")
    # only an async submission is held uncertain on purpose (evidence or an operator decides);
    # a sync call leaves nothing upstream to look up
    held = job.submission_state == Submission.UNCERTAIN and job.provider_kind != SYNC_KIND
    if job.status in IN_FLIGHT and not held:
        found.append(f"stuck_in_flight: {job.status}/{job.submission_state} with no live chain, "
                     f"claim or sweep path (last error {job.reconcile_last_error!r}) ({phase})")
    found += [f"audit: {d.kind} {d.detail} ({phase})" for d in audit]
    return found


def _nodes(value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [value]
    return [str(v) for v in value] if isinstance(value, list) else []


# ----------------------------------------------------------------------------- quiescence


def _drain(rt: Any, ctx: Context) -> None:
    """Run the messages queued so far the way workers would; what they enqueue (the next poll,
    a re-enqueued create) waits for the next round, as its countdown would make it."""
    queues = ctx.explorer.queues
    with queues.lock:
        creates, polls = list(queues.creates), list(queues.polls)
        queues.creates.clear()
        queues.polls.clear()
    for job_id in creates:
        lifecycle.create_step(rt, job_id)
    for poll in polls:
        lifecycle.poll_step(rt, *poll)
    if rt.settings.poll_mode == "batch":  # beat's poll_due tick: whatever is due now
        batch_poll.poll_due(rt, budget=3600.0)


def _next_deadline(rt: Any, job: Job, now: Any) -> Any:
    """The earliest lease, threshold, spacing or grace of the row still ahead (+1 s)."""
    kind = rt.kind(job.provider_kind)
    started = job.provider_call_started_at or job.started_at or job.created_at
    candidates = [
        job.claim_expires_at, job.poll_lease_expires_at, job.create_not_before, job.poll_due_at,
        job.created_at + NOT_STARTED_AGE if job.created_at else None,
        job.create_enqueued_at + NOT_STARTED_AGE if job.create_enqueued_at else None,
        job.reconcile_last_attempt_at + ATTEMPT_SPACING if job.reconcile_last_attempt_at else None,
        started + kind.stale_threshold if kind is not None and started else None,
        job.next_poll_at + SETTLE_GRACE if job.next_poll_at else None,
    ]
    ahead = [c for c in candidates if c is not None and c > now]
    return (min(ahead) if ahead else now + ATTEMPT_SPACING) + timedelta(seconds=1)


def quiesce_and_check(rt: Any, ctx: Context, scenario: Scenario, rounds: int = 40) -> list[str]:
    """Drive the job the way production would — workers run queued messages, time passes to
    the next deadline, the sweep ticks — until it is terminal and settled (or held uncertain
    with its evidence attempts spent), then past the settle grace once more; check."""
    from ..sweep import sweep

    clock = ctx.clock
    for _ in range(rounds):
        _drain(rt, ctx)
        with rt.sessions() as session:
            job = jobstore.load(session, ctx.job_id)
        assert job is not None
        if job.status in TERMINAL and job.credits_actual is not None:
            break
        if job.submission_state == Submission.UNCERTAIN and job.status in IN_FLIGHT \
                and job.reconcile_attempts >= MAX_ATTEMPTS:
            break
        clock.now = max(clock.now, _next_deadline(rt, job, clock.now))
        sweep(rt)
    if job.status not in TERMINAL or job.credits_actual is None:  # past the grace once more
        clock.now += SETTLE_GRACE + timedelta(seconds=1)
        sweep(rt)
        _drain(rt, ctx)
    return check(rt, ctx, scenario, "at quiescence", final=True)


# ----------------------------------------------------------------------------- scenarios


def _pair(state: str, setup: Callable[[Any, Context], None], a: Writer, b: Writer,
          marks: tuple[timedelta, ...], note: str = "") -> Scenario:
    return Scenario(f"{state}:{a.name}/{b.name}", setup, (a, b), marks, note=note)


def _count_settlements(rt: Any, ctx: Context, phase: str) -> list[str]:
    with rt.sessions() as session:
        n = session.execute(select(func.count()).select_from(CreditTransaction).where(
            CreditTransaction.job_id == ctx.job_id,
            CreditTransaction.type.in_(["COMMIT", "REFUND"]),
            CreditTransaction.id.like("job-%"))).scalar_one()
    return [f"settled_twice: {n} settlement transactions ({phase})"] if n > 1 else []


SCENARIOS: tuple[Scenario, ...] = (
    # a new job: the create owner against everyone who may touch a submission
    _pair("new", submitted(), CREATE, CREATE, (CLAIM,), "a duplicate create message"),
    _pair("new", submitted(), CREATE, CANCEL, (CLAIM,)),
    _pair("new", submitted(), CREATE, SWEEP, (CLAIM,)),
    _pair("new", submitted(), CREATE, SWEEP2, (CLAIM, CLAIM + ATTEMPT_SPACING),
          "hole 1 through the sweep's evidence (needs 2 jumps)"),
    _pair("new", submitted(), CREATE, RESOLVE_UPSTREAM, (CLAIM,),
          "hole 1: the late create answer vs an operator's adoption"),
    _pair("new", submitted(), CREATE, RESOLVE_NOT_SUBMITTED, (CLAIM,)),
    _pair("new", submitted(), CREATE, FAIL, (CLAIM,)),
    _pair("new", submitted(), CREATE, WEBHOOK, (CLAIM,)),
    # an accepted job whose upstream task succeeded: completion against everyone else
    _pair("accepted", accepted(), POLL, POLL, (POLL_LEASE,), "a duplicate poll message"),
    _pair("accepted", accepted(), POLL, SWEEP, (POLL_LEASE, REPLICATE_THRESHOLD)),
    _pair("accepted", accepted(), POLL, WEBHOOK, (POLL_LEASE,)),
    _pair("accepted", accepted(), POLL, CANCEL, (POLL_LEASE,)),
    _pair("accepted", accepted(), POLL, FAIL, (POLL_LEASE,)),
    _pair("running", accepted(SUCCEEDS_LATER), POLL, CANCEL, (POLL_LEASE,),
          "the chain's twin of batch_running:poll_due/cancel"),
    _pair("accepted", accepted(), WEBHOOK, CANCEL, (POLL_LEASE,)),
    _pair("accepted", accepted(), SWEEP, CANCEL, (POLL_LEASE, REPLICATE_THRESHOLD)),
    _pair("accepted", accepted(), SWEEP, FAIL, (POLL_LEASE, REPLICATE_THRESHOLD)),
    _pair("workflow", accepted(workflow=True), POLL, WAIT, (NODE_TIMEOUT,),
          "hole 8: the node timeout decided on a stale read"),
    _pair("workflow", accepted(workflow=True), WEBHOOK, WAIT, (NODE_TIMEOUT,)),
    # an uncertain submission: evidence against the operator
    _pair("uncertain", uncertain, SWEEP, RESOLVE_UPSTREAM, (ATTEMPT_SPACING,)),
    _pair("uncertain", uncertain, SWEEP, RESOLVE_NOT_SUBMITTED, (ATTEMPT_SPACING,)),
    _pair("uncertain", uncertain, RESOLVE_UPSTREAM, RESOLVE_NOT_SUBMITTED, ()),
    _pair("uncertain", uncertain, WEBHOOK, RESOLVE_NOT_SUBMITTED, ()),
    _pair("uncertain", uncertain, CANCEL, RESOLVE_UPSTREAM, ()),
    # a failure whose refund is pending
    Scenario("unsettled:settle/sweep", failed_unsettled, (SETTLE, SWEEP), (SETTLE_GRACE,),
             extra_checks=(_count_settlements,)),
    Scenario("unsettled:settle/settle", failed_unsettled, (SETTLE, SETTLE), (),
             extra_checks=(_count_settlements,)),
    # sync kinds: the platform's request against the sweep, a cancel and the operator
    _pair("sync", sync_submitted, SYNC, CANCEL, ()),
    _pair("sync", sync_submitted, SYNC, SWEEP, (SYNC_THRESHOLD,)),
    _pair("sync", sync_submitted, SYNC, FAIL, ()),
    _pair("sync_dead", sync_claimed_dead, CREATE, SWEEP, (SYNC_THRESHOLD,),
          "hole 12: a stray create message for a sync job whose request died"),
    _pair("platform", platform_row, SYNC_PLATFORM, CANCEL, (),
          "hole 6: sync_call on a platform row after a cancel"),
    # batch polling (issue 16): the batch poller against everyone who touches a polled job
    *(Scenario(f"{state}:poll_due/{b.name}", setup, (POLL_DUE, b), marks, settings=BATCH,
               note=note)
      for state, setup, b, marks, note in (
          ("batch", batch_accepted(), POLL_DUE, (BATCH_LEASE,),
           "two pollers: SKIP LOCKED claims; a claim taken over past its lease is fenced"),
          ("batch", batch_accepted(), WEBHOOK, (BATCH_LEASE,), ""),
          ("batch", batch_accepted(), CANCEL, (BATCH_LEASE,), ""),
          ("batch", batch_accepted(), SWEEP, (BATCH_LEASE, REPLICATE_THRESHOLD), ""),
          ("batch_running", batch_accepted(SUCCEEDS_LATER), POLL_DUE, (BATCH_LEASE,),
           "the set-based still-running write under two pollers"),
          ("batch_running", batch_accepted(SUCCEEDS_LATER), CANCEL, (BATCH_LEASE,), ""),
      )),
)

# the bounded exploration `make test` runs (tests/integration/test_explorer.py): one preemption,
# one clock jump, and at most this many schedules each (depth-first order, so deterministic;
# None: the whole tree). Sized for a loaded 2-core machine; `make explore` runs every scenario.
BOUNDED: dict[str, int | None] = {
    "new:create/resolve_upstream": 30,  # hole 1 (58 schedules in all; its violation was #11)
    "workflow:poll/wait_for_job": 40,  # hole 8 (about 200 in all; its violation is #23-#25)
    # batch polling (issue 16)
    "batch:poll_due/poll_due": 40,
    "batch:poll_due/webhook": 40,
    "batch:poll_due/cancel": 40,
    "batch:poll_due/sweep": 40,
    "batch_running:poll_due/poll_due": 40,
    "batch_running:poll_due/cancel": 40,
    "running:poll/cancel": 40,
}


def scenarios_named(names: Sequence[str] | None) -> list[Scenario]:
    if not names:
        return list(SCENARIOS)
    by_name = {s.name: s for s in SCENARIOS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; --list shows them")
    return [by_name[n] for n in names]

