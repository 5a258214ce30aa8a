"""The simulator tests' shared pieces: each provider's auth headers, a fake clock, a simulator
on that clock (``sim``), a plain ``requests`` session (``http``), and the calls that create a
task or read its record over loopback.

A test module takes the fixtures by importing them, ``from tests.integration._sim_helpers import
clock as clock, http as http, sim as sim`` (pytest finds fixtures in the module's namespace; the
``as`` form tells ruff they are used). ``sim`` depends on ``clock``, so a module that imports
``sim`` imports ``clock`` too. They are not in ``tests/integration/conftest.py``: ``sim``,
``clock`` and ``http`` are too generic to be every integration file's fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from reconcile.testing.simulator import Simulator

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


def replicate_create(http: requests.Session, sim: Simulator, job_id: str,
                     model: str = "black-forest-labs/flux-schnell", **extra: Any) -> dict[str, Any]:
    answer = http.post(f"{sim.url}/replicate/v1/models/{model}/predictions", headers=REPLICATE,
                       json={"input": {"prompt": "p"}, "webhook": cb(job_id), **extra})
    assert answer.status_code == 201, answer.text
    return answer.json()


def fal_submit(http: requests.Session, sim: Simulator, job_id: str,
               model: str = "fal-ai/flux/dev") -> dict[str, Any]:
    answer = http.post(f"{sim.url}/fal/{model}", headers=FAL, json={"prompt": "p"},
                       params={"fal_webhook": cb(job_id)})
    assert answer.status_code == 200, answer.text
    return answer.json()
