"""Issue 25: a property test over every entry point that takes customer input — submit, cancel,
snapshot, events (:mod:`reconcile.api`) and webhooks (:func:`reconcile.webhook_ingest.
handle_webhook`) — fed random strings, control characters, non-standard JSON (``NaN``,
``Infinity``, lone surrogates), deep nesting and oversize bodies (real PostgreSQL + the
simulator). Each entry point answers ``(status, body)``; the properties:

* never a 5xx, and the body is JSON the web layer can send;
* nothing written on a 4xx (``jobs``, ``usage_logs``, ``reconcile_credit_transactions``,
  ``reconcile_webhook_deliveries``, ``reconcile_idempotency_keys`` counted before and after);
* nothing unescaped in the operator's terminal: ``reconcile show`` of a job whose customer and
  provider fields hold control characters prints no ESC, BEL, other C0/C1 control, or bidi
  character.

Bounded to stay fast: 40-50 examples per entry point, sizes just over the configured limits."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings, strategies as st
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import api, credits, lifecycle, webhooks
from reconcile.cli import main
from reconcile.db.models import (
    CreditTransaction,
    IdempotencyKey,
    Job,
    UsageLog,
    WebhookDelivery,
)
from reconcile.kinds import all_kinds
from reconcile.testing.simulator import Script, Simulator
from reconcile.webhook_ingest import handle_webhook
from tests.integration.harness import fund
from tests.reliability.support import runtime

LIMIT = 16 * 1024  # max_input_bytes and webhook_max_body_bytes of this test's runtime
FUZZ = settings(deadline=None, max_examples=45, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
HOSTILE = ["\x1b]52;c;SGVsbG8=\x07", "\x1b[2J\x1b[H", "\x1b]0;pwned\x07", "\x07", "\x00", "\x9b31m",
           "\x85", "\u202e", "\u2028", "\r\n", "\ud800", "\udfff", "\ufeff", "\t"]
hostile_text = st.one_of(
    st.text(max_size=30),
    st.lists(st.sampled_from(HOSTILE) | st.text(max_size=5), max_size=6).map("".join),
)
NON_STANDARD = [
    "NaN", "Infinity", "-Infinity", '{"prompt": NaN}', '{"prompt": Infinity}', '{"a": -Infinity}',
    '{"prompt": "\\ud800"}', '{"prompt": "\\udfff x"}', '"\\ud800"', '{"prompt": "\\u0000"}',
    '{"prompt": 1e999}', "1e999", "", " ", "null", "[]", "[1,2]", '"text"', "{", '{"a":}',
    "\x00", "\ufeff{}", '{"prompt": "x", "prompt": "y"}',
    "[" * 100_000 + "]" * 100_000,
    '{"a":' * 3_000 + "1" + "}" * 3_000,
    '{"prompt": "' + "x" * (LIMIT + 10) + '"}',
    json.dumps({"prompt": ["y" * 100] * (LIMIT // 100 + 5)}),
]


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"a": [value]}
    return value


json_leaf = (st.none() | st.booleans() | st.integers() | hostile_text
             | st.floats(allow_nan=True, allow_infinity=True))
json_values = st.recursive(json_leaf, lambda c: st.lists(c, max_size=4)
                           | st.dictionaries(hostile_text, c, max_size=4), max_leaves=15)
inputs = st.one_of(
    st.sampled_from(NON_STANDARD),
    st.sampled_from(NON_STANDARD).map(lambda s: s.encode("utf-8", "surrogatepass")),
    hostile_text,
    st.binary(max_size=40),
    st.dictionaries(st.sampled_from(["prompt", "image", "name", "webhook"]) | hostile_text,
                    json_values, max_size=5),
    st.sampled_from([70, 200, 2_000, 20_000]).map(_nested),
    st.just({"prompt": "x" * (LIMIT + 1)}),
)


def _counts(db: sessionmaker[Session]) -> tuple[int, ...]:
    with db() as s:
        return tuple(s.execute(select(func.count()).select_from(model)).scalar_one()
                     for model in (Job, UsageLog, CreditTransaction, WebhookDelivery, IdempotencyKey))


def _check(db: sessionmaker[Session], before: tuple[int, ...], answer: tuple[int, Any]) -> None:
    status, body = answer
    assert isinstance(status, int) and status < 500, answer
    assert isinstance(body, dict)
    json.dumps(body, allow_nan=False)  # what the web layer sends
    if 400 <= status < 500:
        assert _counts(db) == before, answer  # a refusal writes nothing


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> Any:
    simulator.script_default(Script(timeline=((0.0, "queued"), (0.0, "running"))))
    rt, queues = runtime(db, simulator, tmp_path, max_input_bytes=LIMIT,
                         webhook_max_body_bytes=LIMIT)
    owner = uuid.uuid4()
    fund(db, owner, 10**9)
    job_id = lifecycle.submit_job(rt, owner, "kie-standard", "seedream/4.5-edit",
                                  {"prompt": "a cat"}, 40, job_type="image", enqueue=False).job_id
    assert lifecycle.create_step(rt, job_id).action == "accepted"
    return rt, queues, owner, job_id


def test_submit_never_answers_5xx_and_a_refusal_writes_nothing(world: Any,
                                                                db: sessionmaker[Session]) -> None:
    rt, queues, owner, _ = world
    names = [k.name for k in all_kinds()]

    valid = {"user": owner, "kind": "kie-standard", "model": "seedream/4.5-edit",
             "input": {"prompt": "a cat"}, "amount": 40, "job_type": "image", "key": None}
    hostile = {
        "user": hostile_text | st.just(str(owner)), "kind": st.sampled_from(names) | hostile_text,
        "model": hostile_text, "input": inputs,
        "amount": st.sampled_from([0, -1, 10**15, 2**63]) | st.integers(),
        "job_type": hostile_text, "key": st.sampled_from(["k1", "k2"]) | hostile_text,
    }

    @FUZZ
    @given(data=st.data(), fields=st.lists(st.sampled_from(sorted(hostile)), max_size=3,
                                           unique=True))
    def run(data: st.DataObject, fields: list[str]) -> None:
        # a valid submission with up to three fields replaced: each refusal is for one cause
        request = {**valid, **{f: data.draw(hostile[f], label=f) for f in fields}}
        before = _counts(db)
        _check(db, before, api.submit(rt, request["user"], request["kind"], request["model"],
                                      request["input"], request["amount"],
                                      job_type=request["job_type"],
                                      idempotency_key=request["key"]))
        queues.clear()

    run()


def test_cancel_snapshot_and_events_never_answer_5xx_or_write(world: Any,
                                                               db: sessionmaker[Session]) -> None:
    rt, _, owner, job_id = world
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "processing"

    @FUZZ
    @given(user=st.sampled_from([owner, str(owner)]) | st.uuids() | hostile_text
           | st.just(str(owner).upper() + "\x00"),
           job=st.just(str(job_id)) | st.just(job_id) | hostile_text
           | st.sampled_from([str(job_id) + "\x1b", "\x00", "x" * 100_000, str(uuid.uuid4()),
                              "{" + str(job_id) + "}", str(job_id).replace("-", "")]))
    def run(user: Any, job: Any) -> None:
        before = _counts(db)
        _check(db, before, api.snapshot(rt, user, job))
        _check(db, before, api.cancel(rt, user, job))
        before = _counts(db)
        messages = list(api.follow(rt, user, job, interval=0.001, timeout=0.01,
                                   sleep=lambda _: None))
        assert _counts(db) == before
        if str(user) != str(owner):
            assert messages == []  # never another user's events
        for message in messages:
            assert set(message) == {"id", "event", "data"} and json.loads(message["data"])

    run()


PROVIDER_NAMES = list(webhooks.PROVIDERS)  # every shipped scheme
webhook_bodies = st.one_of(
    st.sampled_from(NON_STANDARD).map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.binary(max_size=60),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.just(b'{"id": "x", "status": "succeeded"' + b" " * LIMIT + b"}"),
)


def test_unsigned_or_badly_signed_webhooks_never_answer_5xx_or_write(
        world: Any, db: sessionmaker[Session]) -> None:
    rt, _, _, job_id = world
    headers = st.dictionaries(
        st.sampled_from(["webhook-id", "webhook-timestamp", "webhook-signature",
                         "X-Webhook-Timestamp", "X-Webhook-Signature", "ElevenLabs-Signature",
                         "X-Fal-Webhook-Signature", "X-Fal-Webhook-Timestamp",
                         "Content-Length"]) | hostile_text,
        hostile_text | st.sampled_from(["v1,AAAA", "t=1,v0=ab", "1e309", "NaN", "-1"]), max_size=5)

    @FUZZ
    @given(provider=st.sampled_from(PROVIDER_NAMES) | hostile_text, headers=headers,
           body=webhook_bodies,
           query=st.dictionaries(st.just("job_id") | hostile_text,
                                 st.just(str(job_id)) | hostile_text, max_size=2))
    def run(provider: str, headers: dict[str, str], body: bytes, query: dict[str, str]) -> None:
        before = _counts(db)
        status, answer = handle_webhook(rt, provider, headers, body, query)
        _check(db, before, (status, answer))
        assert status >= 400, (status, answer)  # nothing here is correctly signed
        assert _counts(db) == before

    run()


C1 = range(0x80, 0xA0)


def _unescaped(output: str) -> list[str]:
    """The characters a terminal would act on or hide (ESC, BEL, C0, C1, bidi, separators)."""
    return [repr(ch) for ch in output if ch != "\n" and (not ch.isprintable() or ord(ch) in C1)]


def test_show_escapes_customer_and_provider_text(world: Any, db: sessionmaker[Session]) -> None:
    """``reconcile show`` of a job whose every customer- or provider-supplied text column holds
    control characters (a row written by a platform, or before submit refused them)."""
    rt, _, _, _ = world
    user, started = uuid.uuid4(), datetime.now(UTC) - timedelta(minutes=5)
    with db.begin() as s:
        credits.grant(s, user, "sub", 1000, f"grant-{uuid.uuid4()}", now=started)

    @settings(deadline=None, max_examples=25, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(texts=st.lists(st.lists(st.sampled_from(HOSTILE[:9] + HOSTILE[10:12]), min_size=1,
                                   max_size=4).map(lambda p: "x" + "".join(p)),
                          min_size=7, max_size=7),
           inp=json_values)
    def run(texts: list[str], inp: Any) -> None:
        job_id = uuid.uuid4()
        clean = [t.replace("\x00", "\ufffd").replace("\ud800", "\ufffd").replace("\udfff", "\ufffd")
                 for t in texts]
        with db.begin() as s:
            s.add(Job(id=job_id, user_id=user, job_type=clean[0], status="failed",
                      created_at=started, started_at=started, provider_kind="kie-standard",
                      provider_model=clean[1], provider_task_id=clean[2], error_code=clean[3],
                      error_message=clean[4], reconcile_last_error=clean[5], node_id=clean[6],
                      submission_state="accepted", input_data={"prompt": clean[0]},
                      error_detail={"provider_message": clean[4]}))
        result = CliRunner().invoke(main, ["show", str(job_id)], obj=rt)
        assert result.exit_code == 0, result.output
        assert "x" in result.output
        assert _unescaped(result.output) == [], result.output

    run()
