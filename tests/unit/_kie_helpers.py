"""The KIE client tests' shared pieces: the settings, the webhook URL that plants the job id,
a create request, a client whose retry sleeps are recorded, and each API's record as KIE answers
it (market, successFlag APIs, Suno, Runway).
"""

from __future__ import annotations

import json
from typing import Any

import requests

from reconcile import Settings
from reconcile.providers import CreateRequest, kie

BASE = "https://kie.test"
HOOK = "https://platform.test/hooks/kie?job_id=job-42"
SETTINGS = Settings(kie_base_url=BASE, kie_api_key="sk-kie", connect_timeout=3.0,
                    read_timeout=11.0, sync_read_timeout=99.0)


def ok(data: Any, key: str = "msg") -> dict[str, Any]:
    return {"code": 200, key: "success", "data": data}


def param(url: str = HOOK) -> str:
    return json.dumps({"model": "m", "callBackUrl": url, "input": {"prompt": "p"}})


def request(model: str = "seedream/4.5-edit", **input: Any) -> CreateRequest:
    return CreateRequest(model=model, input=input or {"prompt": "a cat"}, job_id="job-42",
                         webhook_url=HOOK)


def client(api: kie.KieApi = kie.MARKET, delays: list[float] | None = None) -> kie.KieClient:
    sink = delays if delays is not None else []
    return kie.KieClient(api, SETTINGS, requests.Session(), sleep=sink.append)


def market(state: str, **extra: Any) -> dict[str, Any]:
    return ok({"taskId": "task_1", "model": "m", "state": state, "param": param(),
               "resultJson": "", "failCode": "", "failMsg": "", "createTime": 1698765400000,
               **extra})


def flagged(flag: Any, **response: Any) -> dict[str, Any]:
    return ok({"taskId": "veo_1", "paramJson": param(), "successFlag": flag,
               "response": response or None, "errorCode": None, "errorMessage": None,
               "completeTime": "2025-06-06 10:30:00", "createTime": "2025-06-06 10:25:00"})


def suno(status: str, tracks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return ok({"taskId": "s1", "param": param(), "status": status, "type": "chirp",
               "response": {"taskId": "s1", "sunoData": tracks or []},
               "errorCode": None, "errorMessage": None})


def runway(state: str, **extra: Any) -> dict[str, Any]:
    return ok({"taskId": "r1", "state": state, "generateTime": "2025-06-06 10:30:00",
               "generateParam": {"prompt": "p"}, "expireFlag": 0, **extra})
