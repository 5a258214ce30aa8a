"""The provider simulator, driven over loopback with plain ``requests``.

``simulator`` and ``simulator_session`` come from ``reconcile.testing.fixtures`` via conftest.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from standardwebhooks import Webhook

from reconcile.testing.simulator import Script, SimSecrets, Simulator, SimulatorClient

KIE = {"Authorization": "Bearer sim"}
REPLICATE = {"Authorization": "Bearer sim"}
ELEVEN = {"xi-api-key": "sim"}
FAL = {"Authorization": "Key sim"}
ANTHROPIC = {"x-api-key": "sim", "anthropic-version": "2023-06-01"}
STEPS = [(0, "queued"), (10, "running"), (20, "succeeded")]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock) -> Iterator[Simulator]:
    with Simulator(clock=clock, seed=7) as running:
        yield running


@pytest.fixture
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.trust_env = False
        yield session


def cb(job_id: str) -> str:
    return f"https://platform.test/hooks/provider?job_id={job_id}"


def kie_create(http: requests.Session, sim: Simulator, path: str, job_id: str,
               **body: Any) -> requests.Response:
    body.setdefault("callBackUrl", cb(job_id))
    return http.post(f"{sim.url}/kie{path}", json=body, headers=KIE)


def kie_record(http: requests.Session, sim: Simulator, path: str, task_id: str) -> dict[str, Any]:
    return http.get(f"{sim.url}/kie{path}", params={"taskId": task_id}, headers=KIE).json()


# --- KIE -------------------------------------------------------------------------------------


def test_kie_market_task_walks_its_timeline_to_success(sim, clock, http) -> None:
    """A market task reads waiting → generating → success with JSON-string param and resultJson."""
    sim.script("job-1", Script(timeline=STEPS, outputs=2))
    created = kie_create(http, sim, "/api/v1/jobs/createTask", "job-1",
                         model="seedream/4.5-edit", input={"prompt": "a cat"})
    assert created.status_code == 200 and created.json()["code"] == 200
    task_id = created.json()["data"]["taskId"]
    states = []
    for _ in range(3):
        states.append(kie_record(http, sim, "/api/v1/jobs/recordInfo", task_id)["data"]["state"])
        clock.advance(10)
    assert states == ["waiting", "generating", "success"]
    data = kie_record(http, sim, "/api/v1/jobs/recordInfo", task_id)["data"]
    assert json.loads(data["param"])["callBackUrl"] == cb("job-1")
    urls = json.loads(data["resultJson"])["resultUrls"]
    assert len(urls) == 2 and data["completeTime"] >= data["createTime"]
    media = http.get(urls[1])
    assert media.status_code == 200 and media.headers["Content-Type"] == "image/png"
    assert media.content.startswith(b"\x89PNG")


def test_kie_failure_uses_fail_code_and_the_message_key_variant(sim, clock, http) -> None:
    """A failed market task shows state fail with failCode/failMsg, under ``message`` if scripted."""
    sim.script("job-f", Script(timeline=[(0, "running"), (5, "failed")], fail_code="422",
                               fail_message="prohibited content", kie_msg_key="message"))
    task_id = kie_create(http, sim, "/api/v1/jobs/createTask", "job-f", model="m/x",
                         input={}).json()["data"]["taskId"]
    clock.advance(5)
    record = kie_record(http, sim, "/api/v1/jobs/recordInfo", task_id)
    assert "message" in record and "msg" not in record
    data = record["data"]
    assert (data["state"], data["failCode"], data["failMsg"], data["resultJson"]) == (
        "fail", "422", "prohibited content", "")


def test_kie_vanished_and_unknown_tasks_answer_code_404(sim, clock, http) -> None:
    """Once a task vanishes, its record answers the envelope code 404 like an unknown id."""
    sim.script("job-v", Script(timeline=[(0, "running"), (3, "vanished")]))
    task_id = kie_create(http, sim, "/api/v1/jobs/createTask", "job-v", model="m/x",
                         input={}).json()["data"]["taskId"]
    assert kie_record(http, sim, "/api/v1/jobs/recordInfo", task_id)["code"] == 200
    clock.advance(3)
    assert kie_record(http, sim, "/api/v1/jobs/recordInfo", task_id)["code"] == 404
    assert kie_record(http, sim, "/api/v1/jobs/recordInfo", "nope")["code"] == 404


@pytest.mark.parametrize(("create", "record", "running", "done", "media"), [
    ("/api/v1/veo/generate", "/api/v1/veo/record-info",
     lambda d: d["successFlag"] == 0, lambda d: d["successFlag"] == 1,
     lambda d: d["response"]["resultUrls"][0]),
    ("/api/v1/generate", "/api/v1/generate/record-info",
     lambda d: d["status"] == "PENDING", lambda d: d["status"] == "SUCCESS",
     lambda d: d["response"]["sunoData"][0]["audioUrl"]),
    ("/api/v1/flux/kontext/generate", "/api/v1/flux/kontext/record-info",
     lambda d: d["successFlag"] == 0, lambda d: d["successFlag"] == 1,
     lambda d: d["response"]["resultImageUrl"]),
    ("/api/v1/modify/generate", "/api/v1/modify/record-info",
     lambda d: d["successFlag"] == 0, lambda d: d["successFlag"] == 1,
     lambda d: d["response"]["resultUrls"][0]),
    ("/api/v1/runway/generate", "/api/v1/runway/record-detail",
     lambda d: d["state"] == "queueing", lambda d: d["state"] == "success",
     lambda d: d["videoInfo"]["videoUrl"]),
])
def test_kie_family_endpoints_report_progress_and_media(sim, clock, http, create, record,
                                                        running, done, media) -> None:
    """Veo, Suno, Kontext, Luma and Runway each report their own status field and media path."""
    sim.script_default(Script(timeline=STEPS))
    task_id = kie_create(http, sim, create, "job-k", prompt="p").json()["data"]["taskId"]
    assert running(kie_record(http, sim, record, task_id)["data"])
    clock.advance(20)
    data = kie_record(http, sim, record, task_id)["data"]
    assert done(data)
    assert http.get(media(data)).status_code == 200


def test_kie_veo_failure_sets_success_flag_3(sim, clock, http) -> None:
    """A failed Veo task reports successFlag 3 with its error code and message."""
    sim.script("job-vf", Script(timeline=[(0, "failed")], fail_code="501", fail_message="boom"))
    task_id = kie_create(http, sim, "/api/v1/veo/generate", "job-vf",
                         prompt="p").json()["data"]["taskId"]
    data = kie_record(http, sim, "/api/v1/veo/record-info", task_id)["data"]
    assert (data["successFlag"], data["errorCode"], data["errorMessage"]) == (3, 501, "boom")


def test_kie_200_error_is_an_envelope_code_and_creates_nothing(sim, http) -> None:
    """``kie_200_error:455`` answers HTTP 200 with code 455; the attempt is counted, no create."""
    sim.script("job-m", Script(create="kie_200_error:455"))
    answer = kie_create(http, sim, "/api/v1/jobs/createTask", "job-m", model="m/x", input={})
    assert answer.status_code == 200 and answer.json()["code"] == 455
    assert (sim.creates("job-m"), sim.attempts("job-m")) == (0, 1)


def test_kie_llm_answers_openai_style_at_once(sim, http) -> None:
    """The KIE chat endpoint answers an OpenAI-style completion synchronously and counts it."""
    answer = http.post(f"{sim.url}/kie/gpt-5/v1/chat/completions", headers=KIE,
                       json={"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.json()["choices"][0]["message"]["content"] == "Simulated reply."
    assert sim.creates(provider="kie") == 1


@pytest.mark.parametrize(("path", "check"), [
    ("/kie/api/v1/jobs/createTask", lambda b: b["code"] == 401 and "msg" in b),
    ("/replicate/v1/predictions", lambda b: b["status"] == 401 and "title" in b),
    ("/elevenlabs/v1/dubbing", lambda b: b["detail"]["status"] == "invalid_api_key"),
    ("/fal/fal-ai/flux/dev", lambda b: isinstance(b["detail"], str)),
    ("/anthropic/v1/messages", lambda b: b["error"]["type"] == "authentication_error"),
])
def test_missing_auth_gets_each_providers_401_shape(sim, http, path, check) -> None:
    """A request without the provider's auth header is refused with that provider's 401 body."""
    answer = http.post(sim.url + path, json={})
    assert answer.status_code == 401 and check(answer.json())
    assert sim.attempts() == 0


# --- Replicate -------------------------------------------------------------------------------


def replicate_create(http: requests.Session, sim: Simulator, job_id: str,
                     model: str = "black-forest-labs/flux-schnell", **extra: Any) -> dict[str, Any]:
    answer = http.post(f"{sim.url}/replicate/v1/models/{model}/predictions", headers=REPLICATE,
                       json={"input": {"prompt": "p"}, "webhook": cb(job_id), **extra})
    assert answer.status_code == 201, answer.text
    return answer.json()


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


def fal_submit(http: requests.Session, sim: Simulator, job_id: str,
               model: str = "fal-ai/flux/dev") -> dict[str, Any]:
    answer = http.post(f"{sim.url}/fal/{model}", headers=FAL, json={"prompt": "p"},
                       params={"fal_webhook": cb(job_id)})
    assert answer.status_code == 200, answer.text
    return answer.json()


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


# --- create modes and counters ---------------------------------------------------------------


def test_create_counters_are_kept_per_job_id_and_provider(sim, http) -> None:
    """Accepted creates are counted per planted job id and provider; rejected ones only as attempts."""
    kie_create(http, sim, "/api/v1/jobs/createTask", "job-c", model="m/x", input={})
    replicate_create(http, sim, "job-c")
    fal_submit(http, sim, "job-other")
    sim.script("job-bad", Script(create="reject_invalid"))
    rejected = http.post(f"{sim.url}/replicate/v1/predictions", headers=REPLICATE,
                         json={"version": "v", "input": {}, "webhook": cb("job-bad")})
    assert rejected.status_code == 422 and rejected.json()["invalid_fields"]
    assert sim.creates("job-c") == 2 and sim.creates("job-c", "kie") == 1
    assert (sim.creates("job-bad"), sim.attempts("job-bad")) == (0, 1)
    assert sim.creates() == 3 and sim.creates(provider="fal") == 1


def test_drop_after_accept_creates_the_task_but_the_client_sees_a_transport_error(sim, http) -> None:
    """``drop_after_accept`` closes the connection unanswered while the task exists upstream."""
    sim.script("job-x", Script(create="drop_after_accept"))
    with pytest.raises(requests.ConnectionError):
        kie_create(http, sim, "/api/v1/jobs/createTask", "job-x", model="m/x", input={})
    assert sim.creates("job-x") == 1
    [task] = sim.tasks_for("job-x")
    assert kie_record(http, sim, "/api/v1/jobs/recordInfo", task.task_id)["code"] == 200


def test_rate_limit_answers_429_with_retry_after_then_accepts(sim, http) -> None:
    """``rate_limit`` with ``rate_limit_times=2`` answers 429 + Retry-After twice, then creates."""
    sim.script("job-l", Script(create="rate_limit", rate_limit_times=2, retry_after=3))
    answers = [http.post(f"{sim.url}/fal/fal-ai/flux/dev", headers=FAL, json={},
                         params={"fal_webhook": cb("job-l")}) for _ in range(3)]
    assert [a.status_code for a in answers] == [429, 429, 200]
    assert answers[0].headers["Retry-After"] == "3"
    assert (sim.creates("job-l"), sim.attempts("job-l")) == (1, 3)


def test_server_error_garbage_and_reject_auth_modes(sim, http) -> None:
    """500 creates nothing; ``garbage_2xx`` is an unparseable 200 that did create; 401 on reject_auth."""
    sim.script("job-500", Script(create="server_error"))
    sim.script("job-gb", Script(create="garbage_2xx"))
    sim.script("job-401", Script(create="reject_auth"))

    def post(job: str) -> requests.Response:
        return http.post(f"{sim.url}/replicate/v1/predictions", headers=REPLICATE,
                         json={"version": "v", "input": {}, "webhook": cb(job)})

    assert post("job-500").status_code == 500
    garbage = post("job-gb")
    assert garbage.status_code == 200
    with pytest.raises(ValueError):
        garbage.json()
    assert post("job-401").status_code == 401
    assert [sim.creates(j) for j in ("job-500", "job-gb", "job-401")] == [0, 1, 0]


def test_seeded_chaos_fail_rate_refuses_every_create(sim, http) -> None:
    """With ``fail_rate=1`` every create answers 500 and nothing is created upstream."""
    sim.configure(fail_rate=1.0)
    answer = kie_create(http, sim, "/api/v1/jobs/createTask", "job-z", model="m/x", input={})
    assert answer.status_code == 500 and sim.creates() == 0 and sim.attempts() == 1


def test_latency_delays_each_response(sim, http) -> None:
    """A script's ``latency`` delays every response about its tasks."""
    sim.script_model("slow/model", Script(latency=0.2))
    started = time.monotonic()
    kie_create(http, sim, "/api/v1/jobs/createTask", "job-s", model="slow/model", input={})
    assert time.monotonic() - started >= 0.2


def test_media_urls_answer_403_after_the_media_ttl(sim, clock, http) -> None:
    """Media answer 200 until ``media_ttl`` after success, then 403 (Runway also sets expireFlag)."""
    sim.script_default(Script(timeline=[(0, "succeeded")], media_ttl=60))
    task_id = kie_create(http, sim, "/api/v1/runway/generate", "job-ttl",
                         prompt="p").json()["data"]["taskId"]
    data = kie_record(http, sim, "/api/v1/runway/record-detail", task_id)["data"]
    url = data["videoInfo"]["videoUrl"]
    fetched = http.get(url)
    assert fetched.status_code == 200 and fetched.headers["Content-Type"] == "video/mp4"
    assert data["expireFlag"] == 0
    clock.advance(61)
    assert http.get(url).status_code == 403
    assert kie_record(http, sim, "/api/v1/runway/record-detail", task_id)["data"]["expireFlag"] == 1


def test_set_state_forces_a_state_now(sim, http) -> None:
    """``set_state`` overrides the timeline from that moment."""
    sim.script_default(Script(timeline=[(0, "running"), (999, "succeeded")]))
    prediction = replicate_create(http, sim, "job-ss")
    sim.set_state(prediction["id"], "unknown:mystery")
    assert http.get(prediction["urls"]["get"], headers=REPLICATE).json()["status"] == "mystery"
    with pytest.raises(ValueError):
        sim.set_state(prediction["id"], "exploded")


def test_time_scale_plays_a_long_timeline_fast() -> None:
    """With ``time_scale`` 0.0001 a 30-minute timeline finishes in under a second of real time."""
    with Simulator(time_scale=0.0001) as fast:
        fast.script_default(Script(timeline=[(0, "running"), (1800, "succeeded")]))
        outcome = fast.create(provider="kie", api="kie-market", model="m/x", task_id="t-fast",
                              callback_url=cb("job-fast"), body={})
        assert fast.state_of(outcome.task_id) == "running"
        time.sleep(0.25)
        assert fast.state_of("t-fast") == "succeeded"


# --- webhooks --------------------------------------------------------------------------------


class Receiver:
    """A tiny local webhook receiver that records every POST."""

    def __init__(self) -> None:
        self.got: queue.Queue[tuple[str, Any, bytes]] = queue.Queue()
        got = self.got

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.put((self.path, self.headers, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, count: int) -> dict[str, tuple[Any, bytes]]:
        """The next ``count`` deliveries keyed by the receiver path they were posted to."""
        items = [self.got.get(timeout=5) for _ in range(count)]
        return {path.split("?")[0]: (headers, body) for path, headers, body in items}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_webhooks_arrive_signed_for_every_scheme(sim, clock, http) -> None:
    """Terminal tasks POST signed deliveries: KIE HMAC, Standard Webhooks, fal ED25519, ElevenLabs."""
    receiver = Receiver()
    try:
        sim.script_default(Script(timeline=[(0, "running"), (5, "succeeded")], webhook=True))
        sim.configure(elevenlabs_webhook_url=receiver.url + "/eleven")
        kie_task = kie_create(http, sim, "/api/v1/jobs/createTask", "w1", model="m/x", input={},
                              callBackUrl=receiver.url + "/kie?job_id=w1").json()["data"]["taskId"]
        replicate_create(http, sim, "w2", webhook=receiver.url + "/replicate?job_id=w2")
        http.post(f"{sim.url}/fal/fal-ai/flux/dev", headers=FAL, json={"prompt": "p"},
                  params={"fal_webhook": receiver.url + "/fal?job_id=w3"})
        http.post(f"{sim.url}/elevenlabs/v1/speech-to-text", headers=ELEVEN,
                  files={"file": ("a.mp3", b"ID3")},
                  data={"webhook": "true", "webhook_metadata": json.dumps({"job_id": "w4"})})
        assert receiver.got.empty()
        clock.advance(5)
        got = receiver.take(4)
    finally:
        receiver.close()
    secrets = sim.secrets

    headers, body = got["/kie"]
    payload = json.loads(body)
    assert payload["data"]["taskId"] == kie_task and payload["data"]["state"] == "success"
    signed = f"{kie_task}.{headers['X-Webhook-Timestamp']}".encode()
    expected = base64.b64encode(hmac.new(secrets.kie_webhook_hmac_key.encode(), signed,
                                         hashlib.sha256).digest()).decode()
    assert hmac.compare_digest(headers["X-Webhook-Signature"], expected)

    headers, body = got["/replicate"]
    key = base64.b64decode(secrets.replicate_webhook_secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"] == expected
    Webhook(secrets.replicate_webhook_secret).verify(body, {k.lower(): v for k, v in headers.items()})
    assert json.loads(body)["status"] == "succeeded"

    headers, body = got["/fal"]
    jwk = http.get(sim.base_urls()["RECONCILE_FAL_JWKS_URL"]).json()["keys"][0]
    public = Ed25519PublicKey.from_public_bytes(base64.urlsafe_b64decode(jwk["x"] + "=="))
    message = "\n".join([headers["X-Fal-Webhook-Request-Id"], headers["X-Fal-Webhook-User-Id"],
                         headers["X-Fal-Webhook-Timestamp"], hashlib.sha256(body).hexdigest()])
    public.verify(bytes.fromhex(headers["X-Fal-Webhook-Signature"]), message.encode())
    assert json.loads(body)["status"] == "OK"

    headers, body = got["/eleven"]
    parts = dict(part.split("=", 1) for part in headers["ElevenLabs-Signature"].split(","))
    expected = hmac.new(secrets.elevenlabs_webhook_secret.encode(), f"{parts['t']}.".encode() + body,
                        hashlib.sha256).hexdigest()
    assert parts["v0"] == expected
    assert json.loads(body)["data"]["webhook_metadata"] == {"job_id": "w4"}
    assert len(sim.wait_deliveries(4)) == 4


def test_webhook_delivery_failures_are_ignored(sim, clock, http) -> None:
    """A delivery to a dead receiver is recorded as an error and nothing else breaks."""
    sim.script_default(Script(timeline=[(0, "failed")], webhook=True))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}/cb?job_id=dead"
    replicate_create(http, sim, "dead", webhook=dead)
    [delivery] = sim.wait_deliveries(1)
    assert delivery["status"] is None and delivery["error"] and delivery["state"] == "failed"


# --- control API, fixtures, CLI --------------------------------------------------------------


def test_simulator_client_drives_the_control_api(simulator, http) -> None:
    """``SimulatorClient`` scripts, forces states, reads counters and resets over ``/_control``."""
    control = SimulatorClient(simulator.url)
    assert control.health()["ok"] and control.base_urls() == simulator.base_urls()
    control.script("job-cc", Script(timeline=[(0, "running")], outputs=3))
    prediction = replicate_create(http, simulator, "job-cc")
    assert simulator.tasks[prediction["id"]].script.outputs == 3
    control.set_state(prediction["id"], "succeeded")
    body = http.get(prediction["urls"]["get"], headers=REPLICATE).json()
    assert body["status"] == "succeeded" and len(body["output"]) == 3
    assert control.creates("job-cc") == 1 and control.creates(provider="kie") == 0
    assert control.tasks("job-cc")[0]["state"] == "succeeded"
    with pytest.raises(requests.HTTPError):
        control.set_state(prediction["id"], "bogus")
    control.reset()
    assert control.creates() == 0 and simulator.tasks == {}
    control.close()


def test_session_fixture_and_custom_secrets(simulator_session) -> None:
    """The session fixture is started, and SimSecrets feed the settings environment."""
    assert SimulatorClient(simulator_session.url).health()["ok"]
    secrets = SimSecrets(kie_webhook_hmac_key="k1")
    with Simulator(secrets=secrets) as custom:
        settings = custom.settings()
        assert settings.kie_base_url == custom.url + "/kie"
        assert settings.kie_webhook_hmac_key == "k1"
        assert settings.media_allowed_hosts == ["127.0.0.1:*"]


def test_cli_serves_until_sigterm() -> None:
    """``python -m reconcile.testing.simulator`` prints its URL, answers, and exits on SIGTERM."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "reconcile.testing.simulator", "--port", str(port), "--seed", "3",
         "--time-scale", "0.5"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}"
        assert SimulatorClient(url).health()["url"] == url
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
