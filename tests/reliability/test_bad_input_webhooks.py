"""Bad webhook input (real PostgreSQL + the simulator): arbitrary unsigned deliveries answer
4xx and change nothing; correctly signed odd deliveries never finish a running job; a signed
delivery carrying NUL characters is answered, not a 500; a replayed delivery completes the job
once.

The per-provider body templates of ``_bodies`` are written by hand, one per family with webhooks.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from hypothesis import given, strategies as st
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import credits, lifecycle, webhooks
from reconcile.db.models import Asset, CreditTransaction, JobEvent, WebhookDelivery
from reconcile.testing import sim_registry
from reconcile.testing.simulator import Script, Simulator
from reconcile.webhook_ingest import handle_webhook
from tests.integration.harness import drain
from tests.reliability._bad_input_helpers import (
    DB_FUZZ,
    FAMILIES,
    FOREVER,
    INSTANT,
    load_job,
    submit,
)
from tests.reliability.support import money_snapshot, runtime

# --------------------------------------------------------------------------- webhook fuzz


@dataclass
class Webhooks:
    rt: Any
    db: sessionmaker[Session]
    sim: Simulator
    job_ids: list[str]
    task_ids: list[str]


@pytest.fixture
def webhook_world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> Webhooks:
    """In flight on every async family (upstream running forever), one uncertain, one done."""
    rt, q = runtime(db, simulator, tmp_path)
    simulator.script_default(Script(timeline=FOREVER))
    simulator.configure(elevenlabs_webhook_url=None)
    ids = []
    for kind in FAMILIES:
        job_id = submit(rt, db, kind)
        assert lifecycle.create_step(rt, job_id).action == "accepted"
        ids.append(job_id)
    uncertain = submit(rt, db, "fal-queue")
    simulator.script(str(uncertain), Script(create="drop_after_accept", timeline=FOREVER))
    assert lifecycle.create_step(rt, uncertain).action == "uncertain"
    done = submit(rt, db, "replicate-prediction")
    simulator.script(str(done), Script(timeline=INSTANT))
    lifecycle.create_step(rt, done)
    drain(rt, q)  # type: ignore[arg-type]
    assert load_job(db, done).status == "completed"
    q.clear()
    ids += [uncertain, done]
    return Webhooks(rt, db, simulator, [str(i) for i in ids], list(simulator.tasks))


PROVIDERS = list(webhooks.PROVIDERS)  # every shipped webhook scheme


def _bodies(world: Webhooks, provider: str | None = None) -> st.SearchStrategy[bytes]:
    ids = st.sampled_from(world.task_ids) | st.text(max_size=12) | st.just("\x00")
    jobs = st.sampled_from(world.job_ids) | st.text(max_size=10)
    status = st.sampled_from(["succeeded", "failed", "canceled", "OK", "ERROR", "success",
                              "fail", "dubbed", "COMPLETED", "processing"]) | st.text(max_size=8)
    leaf = ids | jobs | status | st.integers() | st.none() | st.booleans()
    fields = st.sampled_from(["taskId", "task_id", "id", "request_id", "status", "state",
                              "successFlag", "output", "error", "webhook", "payload",
                              "dubbing_id", "name", "transcription_id", "webhook_metadata",
                              "code", "msg", "resultJson", "gateway_request_id", "logs"])
    obj = st.recursive(leaf, lambda c: st.lists(c, max_size=3)
                       | st.dictionaries(fields, c, max_size=6), max_leaves=20)
    shaped = st.one_of(
        st.dictionaries(fields, obj, max_size=8),
        st.builds(lambda d, c: {"code": c, "msg": "x", "data": d},
                  st.dictionaries(fields, obj, max_size=6), st.sampled_from([200, 500, 501])),
        st.builds(lambda d: {"type": "dubbing", "event_timestamp": int(time.time()), "data": d},
                  st.dictionaries(fields, obj, max_size=6)),
    )
    # the providers' own shapes, with the real task ids and odd values in them
    extra = st.dictionaries(fields, obj, max_size=4)
    templates = {
        "replicate": st.builds(lambda i, s, x: {"id": i, "status": s, **x}, ids, status, extra),
        "kie": st.builds(lambda i, s, x: {"code": 200, "msg": "success",
                                          "data": {"taskId": i, "state": s, **x}},
                         ids, status, extra),
        "fal": st.builds(lambda i, s, x: {"request_id": i, "status": s, **x}, ids,
                         st.sampled_from(["OK", "ERROR"]) | status, extra),
        "elevenlabs": st.builds(lambda i, s, x: {"type": "dubbing", "event_timestamp": 1,
                                                 "data": {"dubbing_id": i, "status": s, **x}},
                                ids, status, extra),
    }
    templated = templates.get(provider, shaped) if provider else st.one_of(*templates.values())
    return (shaped | templated).map(lambda d: json.dumps(d).encode()) | st.binary(max_size=80)


def _sign(world: Webhooks, provider: str, body: bytes, delivery: str) -> dict[str, str]:
    """``body`` signed as ``provider`` signs a delivery (its simulator module's signer)."""
    return sim_registry.sign(provider, world.sim, body, int(time.time()))


def _assert_answer(status: int, body: Any) -> None:
    assert 200 <= status < 500, (status, body)
    assert isinstance(body, dict)
    json.dumps(body)  # serialisable as the web layer will


def test_fuzz_unsigned_deliveries_answer_4xx_and_change_nothing(webhook_world: Webhooks) -> None:
    """Arbitrary provider names, headers, bodies and query strings: a 4xx (or 2xx), never an
    exception, never a stored delivery, never a job or ledger change."""
    world = webhook_world
    before = money_snapshot(world.db)

    header_names = st.sampled_from([
        "webhook-id", "webhook-timestamp", "webhook-signature", "X-Webhook-Timestamp",
        "X-Webhook-Signature", "ElevenLabs-Signature", "X-Fal-Webhook-Request-Id",
        "X-Fal-Webhook-User-Id", "X-Fal-Webhook-Timestamp", "X-Fal-Webhook-Signature"]) \
        | st.text(max_size=10)
    header_values = st.text(max_size=50) | st.sampled_from(
        [str(int(time.time())), "v1,AAAA", "t=1,v0=abcd", "00" * 64, "1e309", "-1"])

    @DB_FUZZ
    @given(provider=st.sampled_from(PROVIDERS) | st.text(max_size=10),
           headers=st.dictionaries(header_names, header_values, max_size=6),
           body=_bodies(world),
           query=st.dictionaries(st.sampled_from(["job_id", "x"]) | st.text(max_size=5),
                                 st.sampled_from(world.job_ids) | st.text(max_size=30), max_size=3))
    def run(provider: str, headers: dict[str, str], body: bytes, query: dict[str, str]) -> None:
        status, answer = handle_webhook(world.rt, provider, headers, body, query)
        _assert_answer(status, answer)
        assert status >= 400 or provider not in PROVIDERS, (status, answer)

    run()
    assert money_snapshot(world.db) == before
    with world.db() as s:
        assert s.execute(select(func.count()).select_from(WebhookDelivery)).scalar_one() == 0


def test_fuzz_signed_odd_deliveries_never_finish_a_running_job(webhook_world: Webhooks) -> None:
    """Correctly signed deliveries with arbitrary content naming real jobs and tasks: answered
    2xx/4xx, and since every upstream task is still running (or the job already settled), no
    job changes state or money — a delivery only makes the library re-read the task."""
    world = webhook_world
    before = money_snapshot(world.db)

    @DB_FUZZ
    @given(data=st.data(), job=st.sampled_from(world.job_ids) | st.text(max_size=10),
           delivery=st.uuids())
    def run(data: st.DataObject, job: str, delivery: uuid.UUID) -> None:
        provider = data.draw(st.sampled_from(PROVIDERS))
        body = data.draw(_bodies(world, provider))
        headers = _sign(world, provider, body, f"msg_{delivery.hex}")
        status, answer = handle_webhook(world.rt, provider, headers, body, {"job_id": job})
        _assert_answer(status, answer)

    run()
    assert money_snapshot(world.db) == before


# a genuinely signed delivery of each provider's own shape, with NUL characters in it
NUL = "\x00"
NUL_BODIES = {
    "replicate": {"id": f"task{NUL}", "status": f"succeeded{NUL}", "output": [NUL]},
    "kie": {"code": 200, "msg": NUL, "data": {"taskId": f"t{NUL}", "state": "success"}},
    "fal": {"request_id": f"r{NUL}", "status": "OK", "payload": {"x": NUL}},
    "elevenlabs": {"type": f"dubbing{NUL}", "data": {"dubbing_id": f"d{NUL}", "error": f"e{NUL}"}},
}


@pytest.mark.parametrize("provider", sorted(NUL_BODIES))
def test_signed_delivery_with_nul_characters_is_answered_not_a_500(
        webhook_world: Webhooks, provider: str) -> None:
    """PostgreSQL text/jsonb cannot hold NUL: a genuinely signed delivery carrying ``\\u0000``
    in its ids, status or body is still stored and answered (regression: it raised a
    DataError, i.e. a 500 the provider would retry forever)."""
    world = webhook_world
    body = json.dumps(NUL_BODIES[provider]).encode()
    before = money_snapshot(world.db)
    status, answer = handle_webhook(world.rt, provider, _sign(world, provider, body, "msg_nul"),
                                    body, {"job_id": world.job_ids[0]})
    assert 200 <= status < 300, (status, answer)
    assert money_snapshot(world.db) == before
    with world.db() as s:
        assert s.execute(select(func.count()).select_from(WebhookDelivery)).scalar_one() == 1


# --------------------------------------------------------------------------- replayed webhooks


@pytest.mark.parametrize("kind", ["kie-standard", "replicate-prediction", "fal-queue",
                                  "elevenlabs-async"])
def test_replayed_webhook_is_deduped(db: sessionmaker[Session], simulator: Simulator,
                                     tmp_path: Path, kind: str) -> None:
    """The provider's own signed delivery, delivered three times: the job completes once, one
    commit, one completion event, one asset per output; the replays answer "duplicate"."""
    rt, q = runtime(db, simulator, tmp_path)
    simulator.configure(elevenlabs_webhook_url="http://127.0.0.1:9/hooks/webhooks/elevenlabs")
    job_id = submit(rt, db, kind)
    simulator.script(str(job_id), Script(timeline=((0.0, "queued"), (0.2, "succeeded")),
                                         outputs=2 if kind != "elevenlabs-async" else 1,
                                         webhook=True))
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    q.clear()  # the poll chain is lost: only the webhook can finish the job
    task_id = load_job(db, job_id).provider_task_id
    deadline = time.monotonic() + 10
    while not [d for d in simulator.deliveries if d["task_id"] == task_id]:
        assert time.monotonic() < deadline, "the simulator sent no webhook"
        time.sleep(0.05)
    delivery = [d for d in simulator.deliveries if d["task_id"] == task_id][0]
    url = urlsplit(delivery["url"])
    provider, query = url.path.rsplit("/", 1)[-1], dict(parse_qsl(url.query))
    answers = [handle_webhook(rt, provider, delivery["headers"], delivery["body"], query)
               for _ in range(3)]
    # the first is confirmed and handed to a worker (no media work in the request thread)
    assert answers[0] == (202, {"status": "enqueued"}), answers
    assert answers[1:] == [(200, {"status": "duplicate"})] * 2
    drain(rt, q)  # type: ignore[arg-type]
    job = load_job(db, job_id)
    assert job.status == "completed" and job.credits_actual == 40
    with db() as s:
        assert s.execute(select(func.count()).select_from(CreditTransaction).where(
            CreditTransaction.job_id == job_id, CreditTransaction.type == "COMMIT")).scalar_one() == 1
        assert s.execute(select(func.count()).select_from(JobEvent).where(
            JobEvent.job_id == job_id, JobEvent.type == "completed")).scalar_one() == 1
        outputs = len(job.output_data["outputs"])
        assert s.execute(select(func.count()).select_from(Asset).where(
            Asset.job_id == job_id)).scalar_one() == outputs >= 1
        assert s.execute(select(func.count()).select_from(WebhookDelivery)).scalar_one() == 1
        assert credits.audit(s) == []
    assert simulator.creates(str(job_id)) == 1
