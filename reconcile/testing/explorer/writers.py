"""Internal: the explorer's writers (see :mod:`reconcile.testing.explorer`).

A *writer* is one real library entry point called the way a worker, the beat, the platform's
request or an operator calls it: the create owner, the poll chain, a ``poll_due`` run, the sweep,
the provider's signed webhook, the user's cancel, the operator CLI, settle, a legacy refund's
import, the orchestrator's ``wait_for_job`` and a sync call.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ... import lifecycle
from ...lifecycle import batch as batch_poll
from ...settlement import SettleOutcome
from .common import LEGACY_REFUND, SYNC_INPUT, SYNC_KIND, SYNC_MODEL
from .model import Context, Writer


def _create(rt: Any, ctx: Context) -> str:
    return lifecycle.create_step(rt, ctx.job_id).action


def _poll(rt: Any, ctx: Context) -> str:
    generation, seq = ctx.facts["poll"]
    return lifecycle.poll_step(rt, ctx.job_id, generation, seq)


def _poll_due(rt: Any, ctx: Context) -> str:
    """One ``reconcile.poll_due`` run: claim the due rows, read, write (reconcile.lifecycle.batch)."""
    report = batch_poll.poll_due(rt, budget=3600.0)
    outcomes = ",".join(f"{k}={v}" for k, v in sorted(report.outcomes.items()))
    return f"claimed={report.claimed} fenced={report.fenced} {outcomes}".strip()


def _sweep(rt: Any, ctx: Context) -> str:
    from ...sweep import sweep

    report = sweep(rt)
    return ",".join(f"{a.row}:{a.outcome}" for a in report.actions) or "nothing"


def _sweep_over_budget(rt: Any, ctx: Context) -> str:
    """A beat tick past its time budget from its first page (a backlog): in batch mode a dead
    chain's row goes to the batch poller (made due); any other actionable row is fanned out,
    its per-job task run at once (``reconcile_job``)."""
    from ...sweep import reconcile_job, sweep

    fanned: list[str] = []
    report = sweep(rt, budget=0.0, fan_out=lambda job_id: fanned.append(reconcile_job(rt, job_id)))
    return (",".join(f"{a.row}:{a.outcome}" for a in report.actions) or "nothing") + \
        (f" fanned={','.join(fanned)}" if fanned else "")


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
    from ...webhook_ingest import handle_webhook
    from .. import sim_replicate
    from ..sim_signing import replicate_headers

    task = ctx.wait_for(lambda: _task(ctx))
    if task is None:
        return "no upstream task"
    found = ctx.sim.lookup(task.task_id)
    if found is None:
        return "vanished"
    body = json.dumps(sim_replicate.render(ctx.sim, *found), separators=(",", ":")).encode()
    headers = replicate_headers(ctx.sim.secrets.webhook_secret("replicate"), body,
                                f"msg_{task.task_id}", int(ctx.clock.now.timestamp()))
    query = {k: v[-1] for k, v in parse_qs(urlsplit(task.callback_url or "").query).items()}
    status, answer = handle_webhook(rt, "replicate", headers, body, query)
    return f"{status} {answer.get('status')}"


def _cancel(rt: Any, ctx: Context) -> str:
    """The user's cancel through the gateway helper (200 / 404 / 409)."""
    from ... import api

    status, body = api.cancel(rt, ctx.user_id, ctx.job_id)
    error = body.get("error") if isinstance(body, dict) else None
    return f"{status} {error.get('code') if isinstance(error, dict) else body.get('state')}"


def _cli(rt: Any, *args: str) -> str:
    """The operator CLI, invoked as `reconcile …` would be (in-process, on this runtime)."""
    import click

    from ...cli import main

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


def _legacy_import(rt: Any, ctx: Context) -> str:
    """The platform's ``credits import`` of a legacy refund of 10 credits for the job (a refund
    its old billing code made): recorded while the reservation holds them, refused after the
    settlement (``credits.import_legacy_refund``)."""
    from ... import credits
    from ...errors import LegacyRefundRefused

    try:
        with rt.sessions.begin() as session:
            done = credits.import_legacy_refund(session, ctx.job_id, LEGACY_REFUND,
                                                "legacy-refund-1", now=rt.now())
    except LegacyRefundRefused as exc:
        return f"refused {exc.reason}"
    return "imported" if done else "already imported"


def _wait(rt: Any, ctx: Context) -> str:
    from ...orchestrator import NodeTimeout, wait_for_job

    try:
        return wait_for_job(rt, ctx.job_id, clock=rt.clock, sleep=ctx.sleep)
    except NodeTimeout:
        return "node_timeout"


def _paid(ctx: Context) -> None:
    ctx.facts["paid_calls"] = ctx.facts.get("paid_calls", 0) + 1


def _sync(rt: Any, ctx: Context) -> str:
    """The platform's request running a sync-kind job's call (``sync_call`` + the client)."""
    from ...errors import Conflict, ProviderError
    from ...providers.base import SyncProvider
    from ...sync import sync_call

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
    from ...errors import Conflict, ReconcileError
    from ...providers.base import SyncProvider
    from ...sync import sync_call

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
SWEEP_OVER = Writer("sweep(over budget)", _sweep_over_budget)
WEBHOOK = Writer("webhook", _webhook)
CANCEL = Writer("cancel", _cancel)
FAIL = Writer("fail", _fail)
RESOLVE_UPSTREAM = Writer("resolve_upstream", _resolve_upstream)
RESOLVE_NOT_SUBMITTED = Writer("resolve_not_submitted", _resolve_not_submitted)
SETTLE = Writer("settle", _settle)
LEGACY_IMPORT = Writer("legacy_import", _legacy_import)
WAIT = Writer("wait_for_job", _wait)
SYNC = Writer("sync_call", _sync)
SYNC_PLATFORM = Writer("sync_call(platform)", _sync_platform)
