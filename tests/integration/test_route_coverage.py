"""Route coverage: every path the library's provider clients can call is served by the simulator.

The paths come from the client code, not from a list kept here: every path template in
each provider family's package, ``reconcile/providers/<family>/`` (string constants and f-strings that look like API paths; ``{…}``
parts are wildcards) is collected from the modules' syntax trees. Then every client operation of
every built-in kind runs against the shipped simulator through a recording ``requests.Session``.
A template no recorded request matches fails (a new client path must be exercised here), and so
does any request the simulator had no route for (``Simulator.unrouted``).
"""

from __future__ import annotations

import ast
import base64
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

import reconcile.providers
from reconcile.errors import ReconcileError
from reconcile.kinds import BUILTIN_KINDS, all_kinds, get_kind
from reconcile.providers import AsyncProvider, CreateRequest, SyncProvider, resume
from reconcile.testing import sim_registry
from reconcile.testing.simulator import Script, Simulator

# kind → (model, input): the example each simulator module registers for the kinds it serves
EXAMPLES = sim_registry.examples()
ASYNC = {name: ex for name, ex in EXAMPLES.items()
         if (k := get_kind(name)) is not None and not k.sync}
SYNC = {name: ex for name, ex in EXAMPLES.items() if (k := get_kind(name)) is not None and k.sync}
PROVIDERS_DIR = Path(reconcile.providers.__file__).parent
# module → the simulator prefix its client's base URL points at: every module a built-in kind's
# client lives in, served under the prefix of its own name (sim_<family> registers it)
PREFIX = {m: m for m in sorted({get_kind(n).client.partition(":")[0].split(".")[2]  # type: ignore[union-attr]
                                for n in BUILTIN_KINDS})}
_PATHY = re.compile(r"^(/(v1|api)/|/\{\}/v1/|\{\}/)\S*$")
_FIELD = re.compile(r"\{[^{}]*\}")


def _template(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _FIELD.sub("{}", node.value)  # str.format templates ("/{model}/v1/…") too
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _sources(module: str) -> list[Path]:
    """Every module of a provider family's package (``providers/kie/…``), or its one module."""
    single = PROVIDERS_DIR / f"{module}.py"
    return [single] if single.exists() else sorted((PROVIDERS_DIR / module).glob("*.py"))


def client_path_templates() -> list[tuple[str, str]]:
    """(module, template) of every API path literal in the provider modules."""
    found: set[tuple[str, str]] = set()
    for module, source in ((m, s) for m in sorted(PREFIX) for s in _sources(m)):
        tree = ast.parse(source.read_text())
        inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if id(node) in inner:
                continue  # a piece of an f-string, not a path of its own
            template = _template(node)
            if template and _PATHY.match(template):
                found.add((module, template))
    return sorted(found)


def _regex(template: str) -> re.Pattern[str]:
    """``{}`` is one path segment (a leading one: any base); a template may also be the base
    of longer paths (``base = f"/v1/models/{owner}/{name}"``), so it matches whole segments at
    the start of a path."""
    head = ".*" if template.startswith("{}") else ""
    body = template[2:] if head else template
    return re.compile("^" + head + "[^/]+".join(re.escape(p) for p in body.split("{}")) + "(/|$)")


@dataclass
class Recorded:
    requests: list[tuple[str, str, str]]  # (prefix, method, path below the prefix)
    unrouted: list[tuple[str, str]]
    failures: list[str]  # operations that raised (an unserved path shows here too)


def _session(log: list[tuple[str, str, str]]) -> requests.Session:
    session = requests.Session()

    def record(response: requests.Response, *args: object, **kwargs: object) -> None:
        path = urlsplit(response.request.url or "").path
        prefix, _, rest = path.lstrip("/").partition("/")
        log.append((prefix, response.request.method or "", "/" + rest))

    session.hooks["response"].append(record)
    return session


INSTANT = Script(timeline=((0.0, "queued"), (0.0, "succeeded")))
FOREVER = Script(timeline=((0.0, "queued"), (0.0, "running")))
AUDIO = base64.b64encode(b"RIFF-audio").decode()
# the async model strings each client's docstring names, beyond the one per kind of ASYNC
EXTRA_ASYNC = {
    "replicate-prediction": [("owner/official", {"prompt": "x"}),
                             ("deployment:acme/app", {"prompt": "x"})],
    "elevenlabs-async": [("stt:scribe_v1", {"file_base64": AUDIO})],
    "fal-queue": [("workflows/fal-ai/my-flow", {"prompt": "x"})],
}
SYNC_CALLS = {
    "anthropic-sync": [("claude-sonnet", {"messages": [{"role": "user", "content": "hi"}]})],
    "kie-llm": [("gemini-3-pro", {"prompt": "hi"})],
    "elevenlabs-sync": [
        ("tts:voice1", {"text": "hello"}), ("sound-effects", {"text": "rain"}),
        ("stt:scribe_v1", {"file_base64": AUDIO}),
        ("voice-design", {"voice_description": "calm"}),
        ("voice-create", {"voice_name": "C", "voice_description": "calm",
                          "generated_voice_id": "gv1"}),
        ("voice-clone", {"name": "Me", "files_base64": [AUDIO]}),
        ("forced-alignment", {"file_base64": AUDIO, "text": "hello world"}),
    ],
}


def _exercise_async(sim: Simulator, client: AsyncProvider, kind: str, model: str,
                    inp: dict[str, object]) -> None:
    extra = {"destination": "owner/trained"} if kind == "replicate-training" else {}
    finished = None
    for script, finish in ((INSTANT, True), (FOREVER, False)):
        job_id = str(uuid.uuid4())
        sim.script(job_id, script)
        created = client.create(CreateRequest(
            model=model, input=inp, job_id=job_id, extra=extra,
            webhook_url=f"https://platform.example/hooks/x?job_id={job_id}"))
        if finish:
            resume(client, created.task_id, model=model, interval=0.0, max_polls=5)
            finished = created.task_id
        else:
            client.poll(created.task_id, model=model)
            client.cancel(created.task_id, model=model)
    client.find_created(str(uuid.uuid4()), datetime.now(UTC) - timedelta(minutes=5))
    if kind == "elevenlabs-async" and model == "dubbing":
        client.download_audio(finished, "es")  # type: ignore[attr-defined]


def _call(sim: Simulator, client: SyncProvider, kind: str, model: str,
          inp: dict[str, object]) -> None:
    client.call(model, inp)


@pytest.fixture(scope="module")
def recorded() -> Iterator[Recorded]:
    """Every client operation of every built-in kind, once, against one simulator."""
    log: list[tuple[str, str, str]] = []
    failures: list[str] = []
    with Simulator() as sim:
        for kind in all_kinds():
            client = kind.build(sim.settings(), _session(log))
            if isinstance(client, AsyncProvider) and not kind.sync:
                calls = [(model, inp, _exercise_async) for model, inp in
                         [ASYNC[kind.name], *EXTRA_ASYNC.get(kind.name, [])]]
            else:
                assert isinstance(client, SyncProvider)
                calls = [(model, inp, _call) for model, inp in
                         SYNC_CALLS.get(kind.name, [SYNC[kind.name]])]
            for model, inp, run in calls:
                try:
                    run(sim, client, kind.name, model, dict(inp))
                except ReconcileError as exc:
                    failures.append(f"{kind.name} {model}: {exc.__class__.__name__}: {exc}")
        yield Recorded(log, sim.unrouted, failures)


def test_every_builtin_kind_is_exercised() -> None:
    """The exercise covers every registered kind (its simulator module's example, at least)."""
    names = {k.name for k in all_kinds()}
    assert {n for n in names if n in ASYNC or n in SYNC_CALLS or n in SYNC} == names


def test_every_client_module_has_its_simulator_prefix() -> None:
    assert PREFIX and all(sim_registry.route(prefix) is not None for prefix in PREFIX.values())


def test_no_client_request_fell_through_the_simulator(recorded: Recorded) -> None:
    """Not one request of the library's clients hit a path the simulator does not serve."""
    assert recorded.requests, "nothing was recorded"
    assert recorded.unrouted == []
    assert recorded.failures == []


@pytest.mark.parametrize(("module", "template"), client_path_templates())
def test_client_path_is_exercised_and_served(recorded: Recorded, module: str,
                                             template: str) -> None:
    """This path template of the client code was requested by the exercise (and, by the test
    above, served)."""
    pattern = _regex(template)
    hits = [p for prefix, _, p in recorded.requests if prefix == PREFIX[module] and pattern.match(p)]
    assert hits, f"{module}: no exercised request matched {template!r}"
