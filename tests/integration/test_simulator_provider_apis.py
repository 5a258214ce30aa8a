"""The simulator's Replicate, ElevenLabs, fal and Anthropic APIs over loopback: Replicate's
prediction timeline, failure, cancel, vanish, listing pages, trainings and ``Prefer: wait``;
ElevenLabs' dubbing (too early until dubbed, failed, named by the library) and sync TTS; fal's
queue statuses, failed result and sync endpoint; Anthropic's message and its version header.
"""

from __future__ import annotations

import json

import requests

from reconcile.testing.simulator import Script, Simulator
from tests.integration._sim_helpers import (
    ANTHROPIC,
    ELEVEN,
    FAL,
    REPLICATE,
    STEPS,
    cb,
    clock as clock,
    fal_submit,
    http as http,
    replicate_create,
    sim as sim,
)

# --- Replicate -------------------------------------------------------------------------------


def test_replicate_prediction_walks_its_timeline(sim, clock, http) -> None:
    """A prediction goes starting → processing → succeeded with output URLs and timestamps."""
    sim.script("job-r", Script(timeline=STEPS))
    prediction = replicate_create(http, sim, "job-r")
    assert prediction["status"] == "starting" and prediction["webhook"] == cb("job-r")
    seen = []
    for _ in range(3):
        seen.append(http.get(prediction["urls"]["get"], headers=REPLICATE).json())
        clock.advance(10)
    assert [p["status"] for p in seen] == ["starting", "processing", "succeeded"]
    assert seen[2]["output"][0].startswith(sim.url + "/media/")
    assert seen[2]["started_at"] and seen[2]["completed_at"] and seen[2]["error"] is None


def test_replicate_failure_cancel_and_vanish(sim, clock, http) -> None:
    """Failed predictions carry ``error``; cancel answers ``canceled``; vanished ones answer 404."""
    sim.script("job-rf", Script(timeline=[(0, "running"), (1, "failed")],
                                fail_message="CUDA out of memory"))
    sim.script("job-rv", Script(timeline=[(0, "running"), (1, "vanished")]))
    failed = replicate_create(http, sim, "job-rf")
    canceled = replicate_create(http, sim, "job-rc")
    vanished = replicate_create(http, sim, "job-rv")
    answer = http.post(canceled["urls"]["cancel"], headers=REPLICATE)
    assert answer.status_code == 200 and answer.json()["status"] == "canceled"
    clock.advance(1)
    body = http.get(failed["urls"]["get"], headers=REPLICATE).json()
    assert (body["status"], body["error"]) == ("failed", "CUDA out of memory")
    gone = http.get(vanished["urls"]["get"], headers=REPLICATE)
    assert gone.status_code == 404 and gone.json()["status"] == 404


def test_replicate_listing_pages_with_next_and_filters_created_after(sim, http) -> None:
    """``GET /v1/predictions?created_after=`` pages newest-first through ``next`` cursors."""
    sim.configure(replicate_page_size=2)
    replicate_create(http, sim, "old")
    cutoff = sim.tasks_for("old")[0].created_wall.isoformat()
    for job in ("a", "b", "c"):
        replicate_create(http, sim, job)
    page = http.get(f"{sim.url}/replicate/v1/predictions", headers=REPLICATE,
                    params={"created_after": cutoff}).json()
    found = [p["webhook"] for p in page["results"]]
    assert page["previous"] is None and page["next"]
    page = http.get(page["next"], headers=REPLICATE).json()
    found += [p["webhook"] for p in page["results"]]
    assert page["next"] is None
    assert found == [cb("c"), cb("b"), cb("a")]


def test_replicate_training_output_has_version_and_weights(sim, clock, http) -> None:
    """A training created on a version succeeds with ``{version, weights}`` output."""
    answer = http.post(f"{sim.url}/replicate/v1/models/o/n/versions/abc123/trainings",
                       headers=REPLICATE, json={"destination": "me/tuned", "input": {},
                                                "webhook": cb("job-t")})
    assert answer.status_code == 201 and answer.json()["destination"] == "me/tuned"
    clock.advance(5)
    body = http.get(answer.json()["urls"]["get"], headers=REPLICATE).json()
    assert body["status"] == "succeeded" and body["output"]["weights"].endswith(".tar")
    assert sim.creates("job-t", "replicate") == 1


def test_replicate_prefer_wait_holds_the_create_until_done() -> None:
    """``Prefer: wait`` returns the finished prediction from the create call itself."""
    with Simulator() as live, requests.Session() as http:
        http.trust_env = False
        live.script("job-w", Script(timeline=[(0, "running"), (0.15, "succeeded")]))
        answer = http.post(f"{live.url}/replicate/v1/predictions", headers={
            **REPLICATE, "Prefer": "wait=5"}, json={"version": "v1", "input": {},
                                                    "webhook": cb("job-w")})
        assert answer.json()["status"] == "succeeded"


# --- ElevenLabs ------------------------------------------------------------------------------


def test_elevenlabs_dubbing_is_too_early_until_dubbed(sim, clock, http) -> None:
    """Dubbing audio answers 425 ``dubbing_not_dubbed`` until the status turns ``dubbed``."""
    sim.script("job-d", Script(timeline=STEPS))
    answer = http.post(f"{sim.url}/elevenlabs/v1/dubbing", headers=ELEVEN,
                       files={"file": ("in.mp3", b"ID3 fake")},
                       data={"target_lang": "es", "name": "job_id=job-d"})
    assert answer.status_code == 200 and answer.headers["request-id"]
    dubbing_id = answer.json()["dubbing_id"]
    assert answer.json()["expected_duration_sec"] > 0 and sim.creates("job-d") == 1
    status = http.get(f"{sim.url}/elevenlabs/v1/dubbing/{dubbing_id}", headers=ELEVEN).json()
    assert (status["status"], status["target_languages"]) == ("dubbing", ["es"])
    early = http.get(f"{sim.url}/elevenlabs/v1/dubbing/{dubbing_id}/audio/es", headers=ELEVEN)
    assert early.status_code == 425 and early.json()["detail"]["status"] == "dubbing_not_dubbed"
    clock.advance(20)
    status = http.get(f"{sim.url}/elevenlabs/v1/dubbing/{dubbing_id}", headers=ELEVEN).json()
    audio = http.get(f"{sim.url}/elevenlabs/v1/dubbing/{dubbing_id}/audio/es", headers=ELEVEN)
    assert status["status"] == "dubbed" and status["error"] is None
    assert audio.status_code == 200 and audio.headers["Content-Type"] == "audio/mpeg"
    assert http.get(f"{sim.url}/elevenlabs/v1/dubbing/{dubbing_id}/audio/fr",
                    headers=ELEVEN).status_code == 404


def test_elevenlabs_failed_dubbing_and_sync_tts(sim, http) -> None:
    """A failed dubbing reports ``failed`` with ``error``; TTS answers audio bytes at once."""
    sim.script("job-df", Script(timeline=[(0, "failed")], fail_message="no speech"))
    dubbing_id = http.post(f"{sim.url}/elevenlabs/v1/dubbing", headers=ELEVEN,
                           data={"source_url": "https://x.test/a.mp4", "target_lang": "de",
                                 "webhook_metadata": json.dumps({"job_id": "job-df"})}
                           ).json()["dubbing_id"]
    status = http.get(f"{sim.url}/elevenlabs/v1/dubbing/{dubbing_id}", headers=ELEVEN).json()
    assert (status["status"], status["error"]) == ("failed", "no speech")
    speech = http.post(f"{sim.url}/elevenlabs/v1/text-to-speech/voice1", headers=ELEVEN,
                       json={"text": "hello", "model_id": "eleven_v3"})
    assert speech.headers["Content-Type"] == "audio/mpeg" and speech.content.startswith(b"ID3")
    assert speech.headers["request-id"].startswith("req_")
    assert sim.creates(provider="elevenlabs") == 2


def test_elevenlabs_dubbing_named_by_the_library_counts_for_that_job(sim, http) -> None:
    """A dubbing named ``reconcile-job:<id>`` (as the library's client names it) counts for ``<id>``."""
    http.post(f"{sim.url}/elevenlabs/v1/dubbing", headers=ELEVEN,
              data={"source_url": "https://x.test/a.mp4", "name": "reconcile-job:job-n"})
    assert sim.creates("job-n", "elevenlabs") == 1


# --- fal -------------------------------------------------------------------------------------


def test_fal_queue_status_codes_and_result(sim, clock, http) -> None:
    """Status answers 202 IN_QUEUE/IN_PROGRESS then 200 COMPLETED; the result holds the images."""
    sim.script("job-q", Script(timeline=STEPS))
    submitted = fal_submit(http, sim, "job-q")
    assert submitted["status_url"].endswith(f"/fal/fal-ai/flux/requests/{submitted['request_id']}/status")
    seen = []
    for _ in range(3):
        answer = http.get(submitted["status_url"], headers=FAL)
        seen.append((answer.status_code, answer.json()["status"]))
        clock.advance(10)
    assert seen == [(202, "IN_QUEUE"), (202, "IN_PROGRESS"), (200, "COMPLETED")]
    result = http.get(submitted["response_url"], headers=FAL)
    assert result.headers["x-fal-request-id"] == submitted["request_id"]
    assert result.json()["images"][0]["url"].startswith(sim.url + "/media/")
    with_subpath = f"{sim.url}/fal/fal-ai/flux/dev/requests/{submitted['request_id']}/status"
    assert http.get(with_subpath, headers=FAL).status_code == 404


def test_fal_failure_is_completed_but_the_result_is_422(sim, clock, http) -> None:
    """A failed fal request still shows COMPLETED; only its result answers 422 with ``detail``."""
    sim.script("job-qf", Script(timeline=[(0, "failed")], fail_message="no media generated"))
    submitted = fal_submit(http, sim, "job-qf", "fal-ai/kling-video/v2/text-to-video")
    assert http.get(submitted["status_url"], headers=FAL).json()["status"] == "COMPLETED"
    result = http.get(submitted["response_url"], headers=FAL)
    assert result.status_code == 422
    assert result.json()["detail"][0]["msg"] == "no media generated"
    assert http.put(submitted["cancel_url"], headers=FAL).status_code == 400


def test_fal_sync_call_returns_output_with_media(sim, http) -> None:
    """``/fal-sync`` answers the model output directly, with fetchable media."""
    answer = http.post(f"{sim.url}/fal-sync/fal-ai/flux/schnell", headers=FAL, json={"prompt": "p"})
    url = answer.json()["images"][0]["url"]
    assert answer.headers["x-fal-request-id"] and http.get(url).status_code == 200
    assert sim.creates(provider="fal-sync") == 1


# --- Anthropic -------------------------------------------------------------------------------


def test_anthropic_message_has_request_id_and_needs_version(sim, http) -> None:
    """Messages answer a message object with a ``request-id``; no anthropic-version is a 400."""
    body = {"model": "claude-sonnet-4-5", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}]}
    answer = http.post(f"{sim.url}/anthropic/v1/messages", headers=ANTHROPIC, json=body)
    assert answer.json()["type"] == "message" and answer.json()["id"].startswith("msg_")
    assert answer.headers["request-id"].startswith("req_")
    refused = http.post(f"{sim.url}/anthropic/v1/messages", headers={"x-api-key": "k"}, json=body)
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"
