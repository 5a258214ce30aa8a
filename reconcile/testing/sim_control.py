"""Internal: the library's own mechanics, not an import path for platforms (may move).

The simulator's JSON control API under ``{url}/_control`` (for out-of-process users), and
:class:`SimulatorClient`, its Python client.

=======  ===============  ====================================================================
method   path             body / query → answer
=======  ===============  ====================================================================
GET      /health          → ``{"ok": true, "url"}``
POST     /reset           → ``{"ok": true}``
POST     /script          ``{"job_id"| "model"| neither (default), "script": {Script fields}}``
POST     /state           ``{"task_id", "state"}`` forces a state now
POST     /config          ``{fail_rate, read_fail_rate, latency_range, time_scale,
                          elevenlabs_webhook_url, replicate_page_size}`` (any subset)
GET      /config          → the current values of those knobs
GET      /creates         ``?job_id=&provider=`` → ``{"creates": n}``
GET      /attempts        ``?job_id=&provider=`` → ``{"attempts": n}``
GET      /counters        → ``{"creates": [{provider, job_id, count}], "attempts": [...]}``
GET      /tasks           ``?job_id=`` → ``{"tasks": [{task_id, provider, api, model, job_id,
                          callback_url, state, created_at, webhook_sent}]}``
GET      /deliveries      → ``{"deliveries": [{task_id, job_id, provider, state, url, headers,
                          body, status, error}]}``
=======  ===============  ====================================================================

Bad input answers 400 ``{"error": …}``; an unknown endpoint 404.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import requests

from .sim_core import Response, Script, base_urls_for, json_response

if TYPE_CHECKING:
    # reconcile.testing.simulator.Simulator, which imports this module: named, not imported
    # back (the simulator's modules are not type-checked: pyproject.toml)
    Simulator = Any

CONFIG = ("fail_rate", "read_fail_rate", "latency_range", "time_scale",
          "elevenlabs_webhook_url", "replicate_page_size")


def control(sim: Simulator, method: str, path: str, query: Mapping[str, str],
            body: bytes) -> Response:
    try:
        data = json.loads(body or b"{}") if method in ("POST", "PUT") else {}
        answer = _answer(sim, method, path, query, data)
    except (KeyError, ValueError, TypeError) as exc:
        return json_response(400, {"error": str(exc)})
    if answer is None:
        return json_response(404, {"error": f"no control endpoint {method} {path}"})
    return json_response(200, answer)


def _answer(sim: Simulator, method: str, path: str, query: Mapping[str, str],
            data: dict[str, Any]) -> dict[str, Any] | None:
    job_id, provider = query.get("job_id") or None, query.get("provider") or None
    if method == "GET" and path == "/health":
        return {"ok": True, "url": sim.url}
    if method == "POST" and path == "/reset":
        sim.reset()
        return {"ok": True}
    if method == "POST" and path == "/script":
        script = Script.from_dict(data.get("script") or {})
        if data.get("job_id"):
            sim.script(str(data["job_id"]), script)
        elif data.get("model"):
            sim.script_model(str(data["model"]), script)
        else:
            sim.script_default(script)
        return {"ok": True}
    if method == "POST" and path == "/state":
        sim.set_state(str(data["task_id"]), str(data["state"]))
        return {"ok": True}
    if method == "POST" and path == "/config":
        sim.configure(**data)
        return {"ok": True}
    if method == "GET" and path == "/config":
        return {name: getattr(sim, name) for name in CONFIG}
    if method == "GET" and path == "/creates":
        return {"creates": sim.creates(job_id, provider)}
    if method == "GET" and path == "/attempts":
        return {"attempts": sim.attempts(job_id, provider)}
    if method == "GET" and path == "/counters":
        counters: dict[str, Any] = sim.counters()
        return counters
    if method == "GET" and path == "/tasks":
        now = sim.now()
        return {"tasks": [t.summary(now) for t in sim.tasks.values()
                          if job_id is None or t.job_id == job_id]}
    if method == "GET" and path == "/deliveries":
        return {"deliveries": [{**d, "body": d["body"].decode("utf-8", "replace")}
                               for d in sim.deliveries]}
    return None


class SimulatorClient:
    """Control a simulator in another process through ``{url}/_control``."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.trust_env = False  # loopback: never through a proxy

    def _call(self, method: str, path: str, payload: Any = None,
              params: Mapping[str, Any] | None = None) -> Any:
        response = self.session.request(method, f"{self.url}/_control{path}", json=payload,
                                        params={k: v for k, v in (params or {}).items()
                                                if v is not None}, timeout=self.timeout)
        response.raise_for_status()
        return response.json()

    def base_urls(self) -> dict[str, str]:
        return base_urls_for(self.url)

    def health(self) -> dict[str, Any]:
        answer: dict[str, Any] = self._call("GET", "/health")
        return answer

    def script(self, job_id: str, script: Script) -> None:
        self._call("POST", "/script", {"job_id": job_id, "script": script.to_dict()})

    def script_model(self, model: str, script: Script) -> None:
        self._call("POST", "/script", {"model": model, "script": script.to_dict()})

    def script_default(self, script: Script) -> None:
        self._call("POST", "/script", {"script": script.to_dict()})

    def set_state(self, task_id: str, state: str) -> None:
        self._call("POST", "/state", {"task_id": task_id, "state": state})

    def configure(self, **values: Any) -> None:
        self._call("POST", "/config", values)

    def creates(self, job_id: str | None = None, provider: str | None = None) -> int:
        return int(self._call("GET", "/creates", params={"job_id": job_id, "provider": provider})
                   ["creates"])

    def attempts(self, job_id: str | None = None, provider: str | None = None) -> int:
        return int(self._call("GET", "/attempts", params={"job_id": job_id, "provider": provider})
                   ["attempts"])

    def counters(self) -> dict[str, list[dict[str, Any]]]:
        answer: dict[str, list[dict[str, Any]]] = self._call("GET", "/counters")
        return answer

    def tasks(self, job_id: str | None = None) -> list[dict[str, Any]]:
        tasks: list[dict[str, Any]] = self._call("GET", "/tasks", params={"job_id": job_id})["tasks"]
        return tasks

    def deliveries(self) -> list[dict[str, Any]]:
        deliveries: list[dict[str, Any]] = self._call("GET", "/deliveries")["deliveries"]
        return deliveries

    def reset(self) -> None:
        self._call("POST", "/reset")

    def close(self) -> None:
        self.session.close()


