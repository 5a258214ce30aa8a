"""Issue 15 end to end: documented provider behaviour through the lifecycle and the library's own
clients, against the shipped simulator (which now serves what the providers document)."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from reconcile import api, lifecycle
from reconcile.db.models import Job
from reconcile.errors import ErrorCode
from reconcile.kinds import get_kind
from reconcile.providers import SyncProvider
from reconcile.testing import sim_elevenlabs
from reconcile.testing.simulator import Script, Simulator
from reconcile.webhook_ingest import handle_webhook
from tests.integration.harness import drain, fund, make_runtime

INSTANT = ((0.0, "queued"), (0.0, "succeeded"))
FOREVER = ((0.0, "queued"), (0.0, "running"))


def _run(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, kind: str, model: str,
         inp: dict[str, Any], script: Script) -> tuple[Any, Job]:
    rt, q = make_runtime(db, simulator, tmp_path)
    user = uuid.uuid4()
    fund(db, user)
    simulator.script_model(model, script)
    sub = lifecycle.submit_job(rt, user, kind, model, inp, 10, job_type="audio")
    drain(rt, q)
    with db() as s:
        job = s.get(Job, sub.job_id)
        assert job is not None
        s.expunge(job)
    return rt, job


def test_fal_text_endpoint_completes_with_a_stored_text_object(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """fal-ai/whisper answers {"text": …}: the job completes (not EMPTY_RESULT + refund) and the
    text is stored as an object with a URL, like any media output."""
    rt, job = _run(db, simulator, tmp_path, "fal-queue", "fal-ai/whisper",
                   {"audio_url": "https://example.com/a.mp3"}, Script(timeline=INSTANT))
    assert job.status == "completed", (job.error_code, job.error_message, job.reconcile_last_error)
    outputs = api.snapshot_body(rt, job)["outputs"]
    assert [o["media_type"] for o in outputs] == ["text/plain"] and outputs[0]["url"]
    key = job.output_data["outputs"][0]["key"]
    assert (tmp_path / "media" / key).read_bytes() == b"Simulated transcript."


def test_fal_declared_output_missing_is_still_empty(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A text endpoint with no text, and an image endpoint with no images, are EMPTY_RESULT."""
    for model in ("fal-ai/whisper", "fal-ai/flux/dev"):
        _, job = _run(db, simulator, tmp_path, "fal-queue", model, {"prompt": "x"},
                      Script(timeline=INSTANT, outputs=0))
        assert (job.status, job.error_code) == ("failed", ErrorCode.UPSTREAM_EMPTY_RESULT), model


def test_fal_workflow_endpoint_polls_under_its_namespace(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """workflows/fal-ai/my-flow: status and result read under the namespaced app, so the job
    completes instead of reading 404 (not found) until it times out."""
    _, job = _run(db, simulator, tmp_path, "fal-queue", "workflows/fal-ai/my-flow",
                  {"prompt": "x"}, Script(timeline=INSTANT))
    assert job.status == "completed", (job.error_code, job.reconcile_last_error)


def test_fal_runner_disconnected_fails_with_the_providers_error(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """COMPLETED with error_type runner_disconnected: failed with fal's error type, refunded."""
    script = Script(timeline=((0.0, "queued"), (0.0, "failed")), fail_code="runner_disconnected",
                    fail_message="Runner disconnected unexpectedly")
    _, job = _run(db, simulator, tmp_path, "fal-queue", "fal-ai/flux/dev", {"prompt": "x"}, script)
    assert (job.status, job.error_code) == ("failed", ErrorCode.UPSTREAM_FAILED)
    assert job.error_detail["provider_code"] == "runner_disconnected"
    assert job.error_message == "Runner disconnected unexpectedly"


def test_elevenlabs_stt_webhook_binds_through_the_planted_job(db, simulator, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The captured STT event (data: request_id, webhook_metadata, transcription) completes the
    job whose transcription_id was stored, although its request_id is another id."""
    rt, q = make_runtime(db, simulator, tmp_path)
    user = uuid.uuid4()
    fund(db, user)
    simulator.configure(elevenlabs_webhook_url="https://platform.example/hooks/webhooks/elevenlabs")
    simulator.script_model("scribe_v1", Script(timeline=FOREVER))
    audio = base64.b64encode(b"RIFF-audio").decode()
    sub = lifecycle.submit_job(rt, user, "elevenlabs-async", "stt:scribe_v1",
                               {"file_base64": audio}, 10, job_type="audio")
    lifecycle.create_step(rt, q.creates.popleft())
    with db() as s:
        task_id = s.get(Job, sub.job_id).provider_task_id
    simulator.set_state(task_id, "succeeded")
    task, state, since = simulator.lookup(task_id)  # type: ignore[misc]
    delivery = sim_elevenlabs.callback(simulator, task, state, since)
    assert delivery is not None
    event = json.loads(delivery.body)
    assert "transcription_id" not in event["data"] and event["data"]["request_id"] != task_id
    status, answer = handle_webhook(rt, "elevenlabs", delivery.headers, delivery.body, {})
    # a confirmed success is stored and enqueued (no media work in the request thread)
    assert (status, answer) == (202, {"status": "enqueued"})
    drain(rt, q)
    with db() as s:
        assert s.get(Job, sub.job_id).status == "completed"


def test_elevenlabs_sync_voice_endpoints_answer_the_librarys_calls(simulator) -> None:  # type: ignore[no-untyped-def]
    """Voice design, saving a designed voice, instant cloning and forced alignment: the library's
    calls get the SDK-shaped answers (they were never exercised before: the simulator 404ed)."""
    client = get_kind("elevenlabs-sync").build(simulator.settings())  # type: ignore[union-attr]
    assert isinstance(client, SyncProvider)
    design = client.call("voice-design", {"voice_description": "a calm narrator"})
    assert len(design.outputs) == 3 and all(o.data for o in design.outputs)
    voice_id = design.raw["previews"][0]["generated_voice_id"]  # type: ignore[index]
    saved = client.call("voice-create", {"voice_name": "Calm", "voice_description": "calm",
                                         "generated_voice_id": voice_id})
    assert json.loads(saved.outputs[0].text or "")["voice_id"] == voice_id
    sample = base64.b64encode(b"ID3-sample").decode()
    clone = client.call("voice-clone", {"name": "Me", "files_base64": [sample]})
    assert json.loads(clone.outputs[0].text or "")["voice_id"]
    aligned = client.call("forced-alignment", {"file_base64": sample, "text": "hello world"})
    words = json.loads(aligned.outputs[0].text or "")["words"]
    assert [w["text"] for w in words] == ["hello", "world"]
