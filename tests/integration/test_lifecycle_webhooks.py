"""Webhook deliveries into the lifecycle, on both ledger backends (PostgreSQL + the
simulator): a signed but forged success never completes a running job, a confirmed one completes
it through a worker; a deferred confirming read answers as the inline one; the body cap; a bad
signature stores nothing; a delivery for a job still submitting is kept as evidence.
"""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import select

from reconcile import lifecycle
from reconcile.testing import sim_signing
from reconcile.testing.simulator import Script, Simulator
from reconcile.webhook_ingest import handle_webhook
from tests.integration._lifecycle_helpers import FOREVER, load_job, submit
from tests.integration.harness import drain, make_runtime

pytestmark = pytest.mark.usefixtures("on_each_ledger")


def _kie_delivery(simulator: Simulator, task_id: str, job_id: uuid.UUID, state: str) -> tuple[dict, bytes, dict]:
    body = json.dumps({"code": 200, "msg": "ok", "data": {
        "taskId": task_id, "state": state,
        "resultJson": json.dumps({"resultUrls": ["https://evil.example/x.png"]})}}).encode()
    headers = sim_signing.kie_headers(simulator.secrets.kie_webhook_hmac_key, task_id,
                                      sim_signing.now_seconds())
    return headers, body, {"job_id": str(job_id)}


def test_forged_kie_success_does_not_complete_a_running_job(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A validly signed KIE callback claiming success: the re-read says running, nothing completes."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(timeline=FOREVER))
    lifecycle.create_step(rt, q.creates.popleft())
    task_id = load_job(db, job_id).provider_task_id
    headers, body, query = _kie_delivery(simulator, task_id, job_id, "success")
    status, answer = handle_webhook(rt, "kie", headers, body, query)
    assert status == 200 and answer["job_status"] == "processing"
    assert load_job(db, job_id).status == "processing"
    # the same delivery again is deduplicated
    assert handle_webhook(rt, "kie", headers, body, query) == (200, {"status": "duplicate"})


def test_webhook_completes_when_the_provider_confirms(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A KIE callback for a task the provider reports done completes the job via the CAS path."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(timeline=FOREVER))
    lifecycle.create_step(rt, q.creates.popleft())
    task_id = load_job(db, job_id).provider_task_id
    simulator.set_state(task_id, "succeeded")
    headers, body, query = _kie_delivery(simulator, task_id, job_id, "success")
    # the request thread only confirms and enqueues: the media work is a worker's poll
    assert handle_webhook(rt, "kie", headers, body, query) == (202, {"status": "enqueued"})
    assert load_job(db, job_id).status == "processing"
    drain(rt, q)
    assert load_job(db, job_id).status == "completed"


def test_a_deferred_confirming_read_runs_off_the_request_and_answers_as_inline(  # type: ignore[no-untyped-def]
        db, simulator, tmp_path, monkeypatch) -> None:
    """Issue 25 finding 2: with ``defer``, the request stores the verified delivery and answers
    202 ``confirming`` without reading the provider (a read retried with Retry-After held a
    gateway thread up to ~90 s); the deferred callable does the read and acts as the inline
    path would. Fails on old code: handle_webhook took no ``defer``."""
    from reconcile.db.models import WebhookDelivery

    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(timeline=FOREVER))
    lifecycle.create_step(rt, q.creates.popleft())
    task_id = load_job(db, job_id).provider_task_id
    client = rt.client(rt.kind("kie-standard"))
    reads: list[str] = []
    real = client.poll
    monkeypatch.setattr(client, "poll", lambda t, **kw: reads.append(t) or real(t, **kw))
    headers, body, query = _kie_delivery(simulator, task_id, job_id, "success")
    deferred: list = []
    assert handle_webhook(rt, "kie", headers, body, query, defer=deferred.append) == \
        (202, {"status": "confirming"})
    assert reads == [] and len(deferred) == 1
    with db() as s:  # stored before anything was deferred: never lost
        assert s.execute(select(WebhookDelivery.upstream_id)).scalar_one() == task_id
    status, answer = deferred[0]()
    assert reads == [task_id]
    assert status == 200 and answer["job_status"] == "processing"


def test_webhook_stream_refuses_a_declared_length_unread_and_cuts_a_chunked_body() -> None:
    """Issue 25 finding 3, the library's helper: a ``Content-Length`` over the cap is refused
    (413) before one chunk is pulled; a body without one is pulled only to the cap + 1 byte.
    Fails on old code: the helpers did not exist (handle_webhook took the whole body)."""
    from reconcile import Settings
    from reconcile.webhook_ingest import BodyRefused, handle_webhook_stream, read_capped

    pulled: list[int] = []

    def endless():  # type: ignore[no-untyped-def]
        while True:
            pulled.append(64 * 1024)
            yield b"x" * (64 * 1024)

    class Rt:
        settings = Settings(webhook_max_body_bytes=1024 * 1024)

    status, answer = handle_webhook_stream(Rt(), "kie", {"Content-Length": str(256 << 20)},  # type: ignore[arg-type]
                                           endless(), {})
    assert (status, answer["error"]["code"]) == (413, "WEBHOOK_INVALID") and pulled == []
    status, answer = handle_webhook_stream(Rt(), "kie", {}, endless(), {})  # type: ignore[arg-type]
    assert (status, answer["error"]["code"]) == (413, "WEBHOOK_INVALID")
    assert sum(pulled) == 1024 * 1024 + 64 * 1024  # the chunk that crossed the cap, no more
    with pytest.raises(BodyRefused) as refused:
        read_capped([b"1"], {"content-length": "1e9"}, 10)
    assert refused.value.response[0] == 400
    assert read_capped([b"ab", b"cd"], {"Content-Length": "4"}, 4) == b"abcd"


def test_bad_webhook_signature_is_rejected_and_stores_nothing(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A wrong signature answers 401 and writes nothing."""
    rt, _ = make_runtime(db, simulator, tmp_path)
    headers, body, query = _kie_delivery(simulator, "task_x", uuid.uuid4(), "success")
    headers = {**headers, "X-Webhook-Signature": "AAAA"}
    assert handle_webhook(rt, "kie", headers, body, query)[0] == 401
    from reconcile.db.models import WebhookDelivery

    with db() as s:
        assert s.execute(select(WebhookDelivery)).first() is None


def test_webhook_for_a_submitting_job_is_kept_as_evidence(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A delivery naming a job still uncertain is stored (evidence), not dropped."""
    rt, q = make_runtime(db, simulator, tmp_path)
    job_id = submit(rt, db)
    simulator.script(str(job_id), Script(create="drop_after_accept"))
    drain(rt, q)
    task_id = simulator.tasks_for(str(job_id))[0].task_id
    headers, body, query = _kie_delivery(simulator, task_id, job_id, "success")
    assert handle_webhook(rt, "kie", headers, body, query) == (202, {"status": "evidence"})
    from reconcile.db.models import WebhookDelivery

    with db() as s:
        row = s.execute(select(WebhookDelivery)).scalar_one()
        assert row.job_id == job_id and row.upstream_id == task_id
