"""Internal: finalize — store every output, then complete, commit, add the assets and the event and
reopen the workflow in one transaction; a refused completion, the loser's orphans.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .. import jobstore
from ..db.models import Asset, Job
from ..jobstore.events import add_event, new_event, publish_events
from ..kinds import provider_of
from ..providers.base import Output, PollResult
from ..runtime import Runtime
from ..settlement import Finished, decide
from ..states import TERMINAL, Status
from . import completion

log = logging.getLogger("reconcile.lifecycle")

# the anomaly of a completed job whose row was written back in flight, then re-completed
COMPLETED_ROW_REVERTED = "completed_row_reverted"


@dataclass(frozen=True)
class _Stored:
    key: str
    media_type: str | None


def finalize_job_with_media(rt: Runtime, job_id: uuid.UUID, result: PollResult | None, *,
                            source: str, outputs: tuple[Output, ...] | None = None,
                            job: Job | None = None) -> bool:
    """Store every output, then complete + commit + assets + event + workflow reopen in ONE
    transaction. False: the job was already terminal or another writer won the race.

    ``job``: the row the caller's step just read (a poll turn, a sweep claim); then it is not
    read again. Only fields fixed at submit are taken from it, and its status only as the early
    "already terminal" check: the completion CAS is what decides.
    """
    from ..media.fetch import guess_extension, safe_fetch
    from ..storage import object_key

    outputs = outputs if outputs is not None else (result.outputs if result else ())
    if job is None or job.id != job_id:
        with rt.sessions() as session:
            job = jobstore.load(session, job_id)
    if job is None or job.status in TERMINAL:
        if job is not None and job.status == Status.CANCELLED:
            _completion_refused(rt, job, source)
        return False
    kind = rt.kind(job.provider_kind)
    client = rt.client(kind) if kind is not None else None
    media_headers = getattr(client, "media_headers", None)
    watermark = True if job.should_watermark is None else bool(job.should_watermark)
    is_public = True if job.is_public is None else bool(job.is_public)

    stored: list[_Stored] = []
    texts: list[str] = []
    kept = _already_stored(rt, job)
    for index, output in enumerate(outputs):
        if output.url and index in kept:  # stored by an earlier attempt: never fetched twice
            stored.append(_Stored(kept[index], output.media_type or _media_type_of(kept[index])))
            continue
        if output.data is not None:
            data, media_type = output.data, output.media_type
        elif output.text is not None:
            data, media_type = output.text.encode(), output.media_type or "text/plain"
            texts.append(output.text)
        elif output.url:
            fetched = safe_fetch(output.url, allowed_hosts=rt.settings.media_allowed_hosts,
                                 max_bytes=rt.settings.media_max_bytes,
                                 timeout=rt.settings.media_timeout,
                                 # per URL: a client's key goes only to its own host
                                 headers=media_headers(output.url) if callable(media_headers)
                                 else None)
            data, media_type = fetched.data, output.media_type or fetched.content_type
        else:
            continue
        if watermark and rt.watermark_hook is not None and media_type and \
                media_type.startswith(("image/", "video/")):
            data = rt.watermark_hook(data, media_type, job)
        key = object_key(job.job_type, str(job.id), index,
                         guess_extension(media_type, output.url or ""))
        rt.storage.put(key, data, media_type)
        stored.append(_Stored(key, media_type))
    rt.crash_point("after_upload")

    now = rt.now()
    # the happy path reads no asset: only a completion refused by the assets' unique index (its
    # assets are stored already: the row was written back) is tried again, looking them up
    for look_for_assets in (False, True):
        won = False
        try:
            with rt.sessions.begin() as session:
                # the policy decides what the completion commits (reconcile.settlement); the ledger
                # below executes it (and refuses a price above what is held)
                amount = decide(Finished.COMPLETED,
                                priced=rt.pricing_hook(job, result) if rt.pricing_hook else None).commit
                # an explicit amount is what the commit below charges: written with the completion
                cost = {} if amount is None else {"credits_actual": amount, "display_cost": amount}
                # assets are written only by a winning completion: a job in flight that has them was
                # completed, then its row written back (a platform's stale ORM save). Repaired from
                # what is stored: the same completion CAS, the ledger's commit is a no-op on a settled
                # reservation (the amount it settled is read back), no second asset, hook or reopen
                restored = list(session.execute(select(Asset).where(Asset.job_id == job_id)
                                                .order_by(Asset.index)).scalars()) \
                    if look_for_assets else []
                outputs_data = [{"key": a.storage_key, "media_type": a.media_type} for a in restored] \
                    if restored else [{"key": s.key, "media_type": s.media_type} for s in stored]
                values = dict(output_data={"outputs": outputs_data,
                                           **({"text": "\n".join(texts)} if texts else {})},
                              provider=provider_of(job.provider_kind),
                              provider_cost=result.cost_usd if result else None,
                              completed_at=now, progress=100, error_code=None,
                              error_message=None, reconcile_last_error=None)
                asset_rows = [(index, s.key, s.media_type) for index, s in enumerate(stored)]
                watermarked = watermark and rt.watermark_hook is not None
                one = None
                if not restored and completion.usable(session, rt.ledger, amount):
                    # PostgreSQL, the built-in ledger: the CAS, the commit, the assets and the
                    # event in ONE statement (its credits_actual is the one the commit decides)
                    event = new_event(job, "completed", now,
                                      {"outputs": len(stored), "credits_actual": amount,
                                       "via": source}, rt=rt)
                    one = completion.complete(session, job_id, amount=amount, now=now,
                                              values=values, assets=asset_rows,
                                              is_public=is_public, watermarked=watermarked,
                                              event=event)
                    done = one.job if one is not None else None
                else:
                    done = jobstore.mark_completed(session, job_id, **values, **cost)
                if one is not None and won_in_one(one):
                    won = True
                    assert one.event_id is not None  # written with a settled commit
                    event.id = one.event_id
                    event.payload = {**(event.payload or {}),
                                     "credits_actual": one.job.credits_actual}
                    completed = event
                elif done is not None:
                    # the two-statement path, or the one statement's CAS won but its commit
                    # wrote nothing (the Core path decides, nothing held): the ledger's own call
                    won = True
                    from ..ledger import commit_settled  # the amount with the commit, no re-read

                    actual = commit_settled(rt.ledger, session, job_id, amount, now=now)
                    actual = actual if actual is not None else 0
                    # not known at the completion CAS (no pricing hook), or the commit settled
                    # otherwise (nothing held any more, legacy refunds): written with the
                    # assets and the event below (one statement), or here on the repair path
                    late_cost = actual if actual != amount else None
                    if late_cost is not None and restored:
                        jobstore.record_cost(session, job_id, actual)  # refreshes ``done`` too
                    if restored:
                        jobstore.record_anomaly(session, job_id=job_id, user_id=job.user_id,
                                                kind=COMPLETED_ROW_REVERTED, now=now,
                                                detail={"source": source, "assets": len(restored),
                                                        "credits_actual": done.credits_actual})
                        log.warning("completed_row_reverted job_id=%s source=%s: re-completed from its "
                                    "%d stored assets", job_id, source, len(restored))
                        completed = add_event(session, done, "completed", now,
                                              {"outputs": len(restored),
                                               "credits_actual": done.credits_actual, "via": source},
                                              rt=rt)
                if done is not None and not restored and not won_in_one(one):
                    credits_actual = done.credits_actual if late_cost is None else late_cost
                    completed = jobstore.write_completion(
                        session, done, cost=late_cost, assets=asset_rows,
                        is_public=is_public, watermarked=watermarked,
                        event=new_event(done, "completed", now,
                                        {"outputs": len(stored), "credits_actual": credits_actual,
                                         "via": source}, rt=rt),
                        now=now)
                if done is not None and not restored:
                    _reopen_workflow(session, done)
                    hook = rt.completion_hooks.get(job.provider_kind or "")
                    if hook is not None:
                        hook(session, done, result)
            break
        except IntegrityError:
            if look_for_assets:
                raise
    if not won or restored:
        _drop_orphans(rt, job_id, [s.key for s in stored])
    if not won:
        with rt.sessions() as session:
            current = jobstore.load(session, job_id)
        if current is not None and current.status == Status.CANCELLED:
            _completion_refused(rt, current, source)
        log.info("finalize_lost job_id=%s source=%s", job_id, source)
        return False
    rt.crash_point("after_complete_txn")
    publish_events(rt, [completed])
    log.info("job_completed job_id=%s source=%s outputs=%d", job_id, source, len(stored))
    return True


def won_in_one(one: completion.Completed | None) -> bool:
    """Whether the one statement finished the completion (its commit settled)."""
    return one is not None and one.settlement is not None and bool(one.settlement.done)


def _already_stored(rt: Runtime, job: Job) -> dict[int, str]:
    """Index → key of the outputs an earlier (unfinished) attempt already stored for the job."""
    from ..storage import object_key

    prefix = object_key(job.job_type, str(job.id), 0, "bin").rsplit("/", 1)[0] + "/"
    kept: dict[int, str] = {}
    for key in rt.storage.keys(prefix):
        stem = key[len(prefix):].split(".", 1)[0]
        if stem.isdigit():
            kept.setdefault(int(stem), key)
    return kept


def _media_type_of(key: str) -> str | None:
    from ..media.fetch import media_type_for_extension

    return media_type_for_extension(key.rsplit(".", 1)[-1])


def _completion_refused(rt: Runtime, job: Job, source: str) -> None:
    """A completion after a local cancel is ignored, and logged as an anomaly (README, Design
    notes: Cancel)."""
    with rt.sessions.begin() as session:
        jobstore.record_anomaly(session, job_id=job.id, user_id=job.user_id,
                                kind="completed_after_cancel",
                                detail={"source": source, "task_id": job.provider_task_id},
                                now=rt.now())
    log.warning("completion_after_cancel job_id=%s source=%s", job.id, source)


def _drop_orphans(rt: Runtime, job_id: uuid.UUID, keys: list[str]) -> None:
    """The loser of a race deletes what it stored that no asset row names (best effort)."""
    with rt.sessions() as session:
        named = set(session.execute(select(Asset.storage_key).where(Asset.job_id == job_id)).scalars())
    for key in keys:
        if key not in named:
            try:
                rt.storage.delete(key)
            except Exception:  # best effort; the chaos report counts orphans
                log.warning("orphan_delete_failed job_id=%s key=%s", job_id, key)


def _reopen_workflow(session: Session, job: Job) -> None:
    """A sole-cause failed execution is reopened (CAS on ``failed``; README, Design notes:
    Orchestrators)."""
    from sqlalchemy import update

    from ..db.models import WorkflowExecution

    if job.workflow_execution_id is None or job.node_id is None:
        return
    execution = session.execute(
        select(WorkflowExecution).where(WorkflowExecution.id == job.workflow_execution_id)
        .with_for_update()).scalar_one_or_none()
    if execution is None or execution.status != "failed":
        return
    failed = execution.failed_nodes
    if isinstance(failed, str):
        try:
            failed = json.loads(failed)
        except ValueError:
            return
    if failed != [job.node_id]:
        return  # multi-cause: stays failed; the output is still a standalone asset
    session.execute(update(WorkflowExecution)
                    .where(WorkflowExecution.id == execution.id, WorkflowExecution.status == "failed")
                    .values(status="completed", failed_nodes=[], error_message=None))
