"""Issue 25, findings 5 and 7: no AWS credential survives in a log record (botocore's DEBUG
records of a real S3 put included) or in a stored webhook payload (a presigned output URL), and
the library still works: the put succeeds, the job whose delivery named a presigned URL
completes from a fresh read of the task."""

from __future__ import annotations

import json
import logging
import re
import uuid
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import boto3
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import Asset, Job, WebhookDelivery
from reconcile.storage import S3Storage
from reconcile.testing import sim_signing
from reconcile.testing.simulator import Script, Simulator
from reconcile.webhook_ingest import handle_webhook
from tests.integration.harness import drain, fund, make_runtime

pytest_plugins = ("tests.integration.conftest_s3",)  # the s3_endpoint fixture

ACCESS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SESSION_TOKEN = "FwoGZXIvYXdzEJr//////////wEaDEXAMPLEsessionTOKENvalue0123456789abcdef=="
SIGNATURE_HEX = re.compile(r"(?i)signature[=:]\s*[0-9a-f]{16,}")


def _leaks(text: str, *more: str) -> list[str]:
    secrets = (SESSION_TOKEN, SESSION_TOKEN[:24], quote(SESSION_TOKEN, safe="")[:30],
               ACCESS_KEY_ID, SECRET_KEY, *more)
    return [s for s in secrets if s in text] + SIGNATURE_HEX.findall(text)


def test_botocore_debug_records_of_an_s3_put_hold_no_credential(
        s3_endpoint: str, caplog: pytest.LogCaptureFixture) -> None:
    """Finding 5: with DEBUG on, botocore logs the canonical request (``x-amz-security-token:
    <token>``), the ``Signature:`` it computed and the headers (``Authorization: AWS4-HMAC-SHA256
    Credential=AKIA…, Signature=<hex>``, ``X-Amz-Security-Token``). Every record is redacted,
    formatted message and args alike, and stays a well-formed record; the put still works."""
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                          aws_access_key_id=ACCESS_KEY_ID, aws_secret_access_key=SECRET_KEY,
                          aws_session_token=SESSION_TOKEN)
    bucket = f"reconcile-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    store = S3Storage(bucket, "media", client)
    with caplog.at_level(logging.DEBUG):  # the root: botocore, urllib3 and the library
        store.put("image/j1/0.png", b"png-bytes", "image/png")
        assert store.exists("image/j1/0.png")
        presigned = store.url("image/j1/0.png")
        logging.getLogger("reconcile.test").debug("fetching %s", presigned)
    # the URL is the caller's (a presigned GET); only what is logged must be clean
    url_signature = parse_qs(urlsplit(presigned).query)["Signature"][0]
    url_signature = quote(url_signature, safe="")[:20]
    messages = [r.getMessage() for r in caplog.records]
    assert any("x-amz-security-token" in m.lower() for m in messages)  # the records exist
    assert any(m.startswith("CanonicalRequest:") for m in messages)
    for record, message in zip(caplog.records, messages, strict=True):
        assert _leaks(message, url_signature) == [], (record.name, message[:500])
        assert record.levelname and record.name  # still a record
    assert _leaks(caplog.text, url_signature) == []
    body = client.get_object(Bucket=bucket, Key="media/image/j1/0.png")["Body"].read()
    assert body == b"png-bytes"


def test_a_stored_delivery_keeps_no_presigned_signature_and_the_job_completes(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 7: a signed KIE delivery whose result URL is a presigned S3 URL is stored with
    ``X-Amz-Signature``/``X-Amz-Credential``/``X-Amz-Security-Token`` redacted; the job still
    completes, its output fetched from the live (presigned) URL of a fresh read of the task."""
    signature = "f" * 64
    query = (f"?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={ACCESS_KEY_ID}%2F20261202%2F"
             f"us-east-1%2Fs3%2Faws4_request&X-Amz-Security-Token={SESSION_TOKEN}"
             f"&X-Amz-Expires=3600&X-Amz-Signature={signature}")
    live = simulator.media_urls
    monkeypatch.setattr(simulator, "media_urls", lambda task, ext: [u + query for u in live(task, ext)])

    rt, q = make_runtime(db, simulator, tmp_path)
    user = uuid.uuid4()
    fund(db, user)
    job_id = lifecycle.submit_job(rt, user, "kie-standard", "m", {"prompt": "x"}, 40,
                                  job_type="image").job_id
    simulator.script(str(job_id), Script(timeline=((0.0, "queued"), (0.0, "running"))))
    lifecycle.create_step(rt, q.creates.popleft())
    with db() as s:
        task_id = s.get(Job, job_id).provider_task_id  # type: ignore[union-attr]
    simulator.set_state(task_id, "succeeded")
    body = json.dumps({"code": 200, "msg": "ok", "data": {
        "taskId": task_id, "state": "success",
        "resultJson": json.dumps({"resultUrls": [f"{simulator.url}/media/{task_id}/0.png{query}"]}),
    }}).encode()
    headers = sim_signing.kie_headers(simulator.secrets.kie_webhook_hmac_key, task_id,
                                      sim_signing.now_seconds())
    assert handle_webhook(rt, "kie", headers, body, {"job_id": str(job_id)}) == \
        (202, {"status": "enqueued"})

    with db() as s:
        row = s.execute(select(WebhookDelivery).where(WebhookDelivery.upstream_id == task_id)).scalar_one()
        stored = json.dumps(row.payload)
    assert task_id in stored and "X-Amz-Signature=REDACTED" in stored
    assert signature not in stored and SESSION_TOKEN not in stored and ACCESS_KEY_ID not in stored

    drain(rt, q)
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "completed", (job.status, job.error_code)
        assets = s.execute(select(Asset).where(Asset.job_id == job_id)).scalars().all()
    assert len(assets) == 1
