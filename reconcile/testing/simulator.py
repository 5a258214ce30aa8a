"""A loopback HTTP simulator of the providers' real APIs, shipped for platforms' own tests.

One stdlib ``ThreadingHTTPServer`` on one port serves every provider under a path prefix, so a
client's base URL setting points at it (:meth:`Simulator.base_urls`)::

    {url}/kie  /replicate  /elevenlabs  /fal  /fal-sync  /anthropic   provider APIs
    {url}/media/{task_id}/{index}.{ext}                                 output files
    {url}/_control/...                                                  JSON control API

Each upstream task follows a :class:`Script` (its timeline, how the create answers, media
lifetime, signed webhooks), chosen per planted job id, per model, or the default. The planted job
id is read from the ``job_id`` query parameter of the callback URL (KIE ``callBackUrl``,
Replicate ``webhook``, fal ``fal_webhook``) or ElevenLabs' ``webhook_metadata``/dubbing ``name``;
:meth:`Simulator.creates` counts accepted creates per job id and provider — a job must never be
created twice upstream. Timeline offsets and media TTLs are multiplied by ``time_scale`` (0.01
plays a 30-minute timeline in 18 s); inject ``clock`` (default ``time.monotonic``) to step time
in tests instead of sleeping. Run standalone with ``python -m reconcile.testing.simulator``.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from . import sim_registry
from .sim_control import CONFIG, SimulatorClient, control
from .sim_core import (
    GARBAGE,
    MEDIA,
    Rejection,
    Request,
    Response,
    Script,
    SimSecrets,
    Task,
    base_urls_for,
    check_state,
    json_response,
    planted_job_id,
)
from .sim_delivery import Delivering
from .sim_http import Serving, SimServer
from .sim_signing import fal_key

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["Script", "SimSecrets", "Simulator", "SimulatorClient", "Task", "base_urls_for", "main"]

# importing the provider modules registers their routes and webhooks (:mod:`.sim_registry`):
# the simulator module every built-in family declares; one that does not load costs only its
# family (:func:`.sim_registry.missing`)
PROVIDER_MODULES = sim_registry.load_builtin(strict=False)
_REJECTS = {"reject_invalid": "invalid", "reject_auth": "auth", "server_error": "server_error"}


class Simulator(Serving, Delivering):
    """The provider simulator: start it, point clients at :meth:`base_urls`, script, count."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, seed: int | None = None,
                 secrets: SimSecrets | None = None, clock: Callable[[], float] | None = None,
                 time_scale: float = 1.0) -> None:
        self.host, self.port, self.seed = host, port, seed
        self.secrets = secrets or SimSecrets()
        self.clock = clock or time.monotonic
        self.fal_key = fal_key(self.secrets.fal_key_seed)
        self._initial_time_scale = time_scale
        self._lock = threading.RLock()
        self._local = threading.local()
        self._ids = random.Random(None if seed is None else f"ids-{seed}")
        self._server: SimServer | None = None
        self._tls_servers: list[SimServer] = []
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._url: str | None = None
        self._clear()

    def _clear(self) -> None:
        with self._lock:
            self.random = random.Random(self.seed)  # seeded chaos
            self.fail_rate = 0.0  # chance an accepted create answers 500 instead (not created)
            self.read_fail_rate = 0.0  # chance a GET answers the provider's 500
            self.latency_range: tuple[float, float] | None = None  # extra random latency
            self.time_scale = self._initial_time_scale  # timeline seconds × this = real seconds
            self.elevenlabs_webhook_url: str | None = None  # ElevenLabs' workspace webhook
            self.replicate_page_size = 100
            self.default_script = Script()
            self._job_scripts: dict[str, Script] = {}
            self._model_scripts: dict[str, Script] = {}
            self._tasks: dict[str, Task] = {}
            self._sync_tasks: dict[str, Task] = {}
            self._creates: Counter[tuple[str, str | None]] = Counter()
            self._attempts: Counter[tuple[str, str | None]] = Counter()
            self._limited: Counter[tuple[str, str]] = Counter()
            self._deliveries: list[dict[str, Any]] = []
            self._unrouted: list[tuple[str, str]] = []  # requests no route serves

    def base_urls(self) -> dict[str, str]:
        return base_urls_for(self.url)

    def env(self) -> dict[str, str]:
        """:meth:`base_urls` plus API keys and webhook secrets: a full settings environment
        (every registered route's ``api_key_settings`` and provider's ``secret_setting``)."""
        keys = {sim_registry.env_name(setting): "sim-key"
                for route in sim_registry.routes() for setting in route.api_key_settings}
        return {**self.base_urls(), **keys, **self.secrets.settings_env()}

    def settings(self, **overrides: Any) -> Settings:
        """A :class:`~reconcile.settings.Settings` pointed at this simulator."""
        from ..settings import Settings

        values: dict[str, Any] = {k.removeprefix("RECONCILE_").lower(): v
                                  for k, v in self.env().items()}
        values["media_allowed_hosts"] = json.loads(values["media_allowed_hosts"])
        return Settings(**{**values, **overrides})

    def now(self) -> float:
        return self.clock()

    # --- scripting ------------------------------------------------------------------------------

    def script(self, job_id: str, script: Script) -> None:
        """Tasks created for planted ``job_id`` follow ``script``."""
        with self._lock:
            self._job_scripts[job_id] = script

    def script_model(self, model: str, script: Script) -> None:
        """Tasks of ``model`` (without a job script) follow ``script``."""
        with self._lock:
            self._model_scripts[model] = script

    def script_default(self, script: Script) -> None:
        with self._lock:
            self.default_script = script

    def set_state(self, task_id: str, state: str) -> None:
        """Force ``task_id`` into ``state`` now; the timeline no longer applies to it."""
        check_state(state)
        with self._lock:
            if task_id not in self._tasks:
                raise KeyError(f"no task {task_id!r}")
            self._tasks[task_id].forced = (self.now(), state)

    def configure(self, **values: Any) -> None:
        """Set chaos and behaviour knobs: ``fail_rate``, ``read_fail_rate``, ``latency_range``,
        ``time_scale``, ``elevenlabs_webhook_url``, ``replicate_page_size``."""
        unknown = set(values) - set(CONFIG)
        if unknown:
            raise ValueError(f"unknown settings {sorted(unknown)}")
        with self._lock:
            for name, value in values.items():
                if name == "latency_range" and value is not None:
                    value = (float(value[0]), float(value[1]))
                setattr(self, name, value)

    def reset(self) -> None:
        """Forget tasks, counters, scripts, deliveries and chaos settings (ids never repeat)."""
        self._clear()

    # --- inspection -----------------------------------------------------------------------------

    def creates(self, job_id: str | None = None, provider: str | None = None) -> int:
        """Accepted creates (tasks that exist upstream), filtered by job id and/or provider."""
        return self._count(self._creates, job_id, provider)

    def attempts(self, job_id: str | None = None, provider: str | None = None) -> int:
        """Create requests received, rejected ones included."""
        return self._count(self._attempts, job_id, provider)

    def _count(self, counter: Counter[tuple[str, str | None]], job_id: str | None,
               provider: str | None) -> int:
        with self._lock:
            return sum(n for (p, j), n in counter.items()
                       if (job_id is None or j == job_id) and (provider is None or p == provider))

    def counters(self) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            return {name: [{"provider": p, "job_id": j, "count": n} for (p, j), n in c.items()]
                    for name, c in (("creates", self._creates), ("attempts", self._attempts))}

    @property
    def tasks(self) -> dict[str, Task]:
        """Every upstream task by id (a copy of the mapping; the tasks are live)."""
        with self._lock:
            return dict(self._tasks)

    def tasks_for(self, job_id: str) -> list[Task]:
        return [t for t in self.tasks.values() if t.job_id == job_id]

    def state_of(self, task_id: str) -> str:
        return self._tasks[task_id].state_at(self.now())[0]

    @property
    def unrouted(self) -> list[tuple[str, str]]:
        """(method, path) of every request no provider route served (answered a bare 404): a
        client calling an endpoint the simulator does not know."""
        with self._lock:
            return list(self._unrouted)

    # --- used by the provider route modules -----------------------------------------------------

    def script_for(self, job_id: str | None, model: str | None) -> Script:
        with self._lock:
            script = (self._job_scripts.get(job_id or "") or self._model_scripts.get(model or "")
                      or self.default_script)
        self._local.script = script
        return script

    def create(self, *, provider: str, api: str, model: str, task_id: str,
               callback_url: str | None, body: Mapping[str, Any], job_id: str | None = None,
               extra: dict[str, Any] | None = None) -> Task | Rejection:
        """Decide a create by its script: a stored, counted :class:`Task`, or a rejection."""
        job_id = job_id if job_id is not None else planted_job_id(callback_url)
        with self._lock:
            script = self.script_for(job_id, model)
            self._attempts[(provider, job_id)] += 1
            rejected = self._decide(provider, model, job_id, script)
            if rejected is not None:
                return rejected
            task = Task(task_id, provider, api, model, job_id, callback_url, dict(body), script,
                        self.now(), self.wall_now(), scale=self.time_scale, extra=extra or {})
            self._tasks[task_id] = task
            self._creates[(provider, job_id)] += 1
        self._local.mode = script.create
        return task

    def call(self, provider: str, model: str, job_id: str | None = None) -> Rejection | None:
        """Decide a sync call by its script; None when accepted (and counted)."""
        with self._lock:
            script = self.script_for(job_id, model)
            self._attempts[(provider, job_id)] += 1
            rejected = self._decide(provider, model, job_id, script)
            if rejected is None:
                self._creates[(provider, job_id)] += 1
        if rejected is None:
            self._local.mode = script.create
        return rejected

    def _decide(self, provider: str, model: str, job_id: str | None,
                script: Script) -> Rejection | None:
        mode = script.create
        if mode == "rate_limit":
            key = (provider, job_id or model)
            if script.rate_limit_times is None or self._limited[key] < script.rate_limit_times:
                self._limited[key] += 1
                return Rejection("rate_limit", script)
            return None
        if mode in _REJECTS:
            return Rejection(_REJECTS[mode], script)
        if mode.startswith("kie_200_error:"):
            return Rejection("kie_200_error", script, int(mode.split(":", 1)[1]))
        if self.fail_rate and self.random.random() < self.fail_rate:
            return Rejection("server_error", script)
        return None

    def lookup(self, task_id: str, *apis: str) -> tuple[Task, str, float] | None:
        """(task, state, clock time the state began), or None when unknown or vanished."""
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None or (apis and task.api not in apis):
            return None
        self._local.script = task.script
        state, since = task.state_at(self.now())
        return None if state == "vanished" else (task, state, since)

    def sync_task(self, provider: str, model: str, body: Mapping[str, Any]) -> Task:
        """A finished task standing for a sync call's outputs (served under /media, not polled)."""
        script = self.script_for(None, model)
        task = Task(self.new_uuid(), provider, provider, model, None, None, dict(body),
                    replace(script, timeline=((0.0, "succeeded"),)), self.now(), self.wall_now(),
                    scale=self.time_scale)
        with self._lock:
            self._sync_tasks[task.task_id] = task
        return task

    def media_urls(self, task: Task, ext: str) -> list[str]:
        return [f"{self.url}/media/{task.task_id}/{i}.{ext}" for i in range(task.script.outputs)]

    def media_expired(self, task: Task) -> bool:
        now = self.now()
        done = task.first_at({"succeeded"}, now)
        ttl = task.script.media_ttl
        return done is not None and ttl is not None and now >= done[1] + ttl * task.scale

    def new_id(self, length: int, alphabet: str = "abcdefghijklmnopqrstuvwxyz0123456789") -> str:
        with self._lock:
            return "".join(self._ids.choice(alphabet) for _ in range(length))

    def new_uuid(self) -> str:
        with self._lock:
            return str(uuid.UUID(int=self._ids.getrandbits(128), version=4))

    def wall_now(self) -> datetime:
        return datetime.now(UTC)

    # --- HTTP -----------------------------------------------------------------------------------

    def dispatch(self, method: str, target: str, headers: Mapping[str, str],
                 body: bytes) -> Response:
        """Answer one HTTP request (the server calls this; tests may too)."""
        split = urlsplit(target)
        prefix, _, rest = split.path.lstrip("/").partition("/")
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        self._local.script, self._local.mode = None, None
        if prefix == "_control":
            return control(self, method, "/" + rest, query, body)
        if prefix == "media":
            response = self._media(method, rest)
        elif (module := sim_registry.route(prefix)) is None:
            response = self._unserved(method, split.path)
        else:
            req = Request(method, "/" + rest, query, dict(headers), body)
            if not module.authorized(req):
                response = module.error("auth", self.default_script)
            elif method == "GET" and self.read_fail_rate and self._chance(self.read_fail_rate):
                response = module.error("server_error", self.default_script)
            else:
                response = module.handle(self, req) or self._unserved(method, split.path)
        script = self._local.script or self.default_script
        if response.status < 300 and self._local.mode == "drop_after_accept":
            response = Response(drop=True)
        elif response.status < 300 and self._local.mode == "garbage_2xx":
            response = Response(200, GARBAGE, {"Content-Type": "application/json"})
        response.latency = script.latency + self._jitter()
        return response

    def _unserved(self, method: str, path: str) -> Response:
        with self._lock:
            self._unrouted.append((method, path))
        return json_response(404, {"detail": "Not Found"})

    def _chance(self, rate: float) -> bool:
        with self._lock:
            return self.random.random() < rate

    def _jitter(self) -> float:
        if not self.latency_range:
            return 0.0
        with self._lock:
            return self.random.uniform(*self.latency_range)

    def _media(self, method: str, rest: str) -> Response:
        task_id, _, name = rest.partition("/")
        index, _, ext = name.partition(".")
        with self._lock:
            task = self._tasks.get(task_id) or self._sync_tasks.get(task_id)
        if method not in ("GET", "HEAD"):
            return Response(405, b"", {"Allow": "GET, HEAD"})
        if task is None or not index.isdigit() or int(index) >= task.script.outputs or ext not in MEDIA:
            return Response(404, b"NoSuchKey", {"Content-Type": "text/plain"})
        self._local.script = task.script
        if task.first_at({"succeeded"}, self.now()) is None:
            return Response(404, b"NoSuchKey", {"Content-Type": "text/plain"})
        if self.media_expired(task):
            body = b"<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>"
            return Response(403, body, {"Content-Type": "application/xml"})
        content_type, data = MEDIA[ext]
        return Response(200, data, {"Content-Type": content_type})


def main(argv: list[str] | None = None) -> int:
    """Serve the simulator until SIGTERM/SIGINT (:func:`.sim_main.main`)."""
    from .sim_main import main as serve

    return serve(argv, Simulator)


if __name__ == "__main__":
    raise SystemExit(main())
