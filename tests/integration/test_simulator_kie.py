"""The simulator's KIE APIs over loopback: a market task walks its timeline to success (or
its scripted failure, under ``msg`` or ``message``), a vanished or unknown task answers code 404,
each dedicated API (Veo, Suno, Kontext, Luma, Runway) reports its own status field and media, an
HTTP-200 error envelope creates nothing, and the chat endpoint answers at once.
"""

from __future__ import annotations

import json

import pytest

from reconcile.testing.simulator import Script
from tests.integration._sim_helpers import (
    KIE,
    STEPS,
    cb,
    clock as clock,
    http as http,
    kie_create,
    kie_record,
    sim as sim,
)

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
