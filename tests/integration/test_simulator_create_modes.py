"""The simulator's scripted create modes and counters over loopback: each provider's 401
without auth, creates counted per job id and provider, ``drop_after_accept``, ``rate_limit``,
``server_error`` / ``garbage_2xx`` / ``reject_auth``, a seeded fail rate, latency, the media TTL,
``set_state`` and ``time_scale``.
"""

from __future__ import annotations

import time

import pytest
import requests

from reconcile.testing.simulator import Script, Simulator
from tests.integration._sim_helpers import (
    FAL,
    REPLICATE,
    cb,
    clock as clock,
    fal_submit,
    http as http,
    kie_create,
    kie_record,
    replicate_create,
    sim as sim,
)


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
