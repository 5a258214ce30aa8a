"""The provider contract (:mod:`reconcile.providers.family`), which every family passes — as
``test_ledger_contract.py`` is the ledger seam's: parametrized over the registry's families and
their kinds, each client driven over loopback HTTP against its family's simulator module.
Nothing here names a family: a new one is covered by declaring it.

What a family's own tests keep is what only it does (its request bodies, its status words, its
envelope codes); what every family does the same way is here once.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import requests

from reconcile import webhooks
from reconcile.errors import (
    CreateRateLimited,
    CreateRejected,
    CreateUncertain,
    ErrorCode,
    ReadFailed,
    SyncCallFailed,
)
from reconcile.kinds import all_kinds, get_kind, provider_of
from reconcile.providers import (
    AsyncProvider,
    CreateRequest,
    PollResult,
    PollStatus,
    SyncProvider,
    resume,
    run,
)
from reconcile.providers.family import Kind, ProviderFamily, families
from reconcile.providers.http import HttpClient
from reconcile.testing import sim_registry
from reconcile.testing.sim_control import CONFIG
from reconcile.testing.simulator import Script, Simulator

FAMILIES = families()
ASYNC = [pytest.param(f, k, id=k.name) for f in FAMILIES for k in f.kinds if not k.sync]
SYNC = [pytest.param(f, k, id=k.name) for f in FAMILIES for k in f.kinds if k.sync]
BY_NAME = [pytest.param(f, id=f.name) for f in FAMILIES]
INSTANT = ((0.0, "queued"), (0.0, "succeeded"))
TRANSPORT = [requests.ConnectTimeout("connect"), requests.ReadTimeout("read"),
             requests.ConnectionError("reset by peer")]


def _example(family: ProviderFamily, kind: Kind) -> tuple[str, dict[str, Any]]:
    """The request of ``kind`` its family's simulator module registers; a family whose module
    did not load fails here, with the reason, and costs no other family a test."""
    why = sim_registry.missing().get(family.name)
    if why is not None:
        pytest.fail(f"provider family {family.name!r} has no simulator: {why}")
    example = sim_registry.examples().get(kind.name)
    if example is None:
        pytest.fail(f"{family.simulator} registers no example request of kind {kind.name!r} "
                    f"(SimRoute.examples)")
    model, inp = example
    return model, dict(inp)


def _request(family: ProviderFamily, kind: Kind, job_id: str) -> CreateRequest:
    model, inp = _example(family, kind)
    extra = {"destination": "owner/trained"} if kind.name == "replicate-training" else {}
    return CreateRequest(model=model, input=inp, job_id=job_id,
                         webhook_url=f"https://platform.example/hooks/webhooks/{family.name}"
                                     f"?job_id={job_id}", extra=extra)


def _async(kind: Kind, sim: Simulator, session: requests.Session | None = None) -> AsyncProvider:
    client = kind.build(sim.settings(), session)
    assert isinstance(client, AsyncProvider), kind.name
    return client


class Faults(requests.adapters.HTTPAdapter):
    """Answers the first reads with ``statuses`` (a 429 says Retry-After: 2), or raises
    ``error`` on every exchange of ``methods``; otherwise the simulator answers."""

    def __init__(self, statuses: tuple[int, ...] = (), error: Exception | None = None,
                 methods: tuple[str, ...] = ("GET",)) -> None:
        super().__init__()
        self.statuses, self.error, self.methods = list(statuses), error, methods
        self.seen: list[str] = []

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        self.seen.append(request.method or "")
        if request.method in self.methods:
            if self.error is not None:
                raise self.error
            if self.statuses:
                answer = requests.Response()
                answer.status_code = self.statuses.pop(0)
                answer.request, answer.url = request, request.url or ""
                if answer.status_code == 429:
                    answer.headers["Retry-After"] = "2"
                answer._content, answer._content_consumed = b"", True  # type: ignore[attr-defined]
                return answer
        return super().send(request, **kwargs)


def _faulty(adapter: Faults) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.mount("http://", adapter)
    return session


def _quiet(client: Any) -> list[float]:
    """Every retry wait of ``client``'s HTTP plumbing, recorded instead of slept."""
    sleeps: list[float] = []
    for value in vars(client).values():
        if isinstance(value, HttpClient):
            value.sleep = sleeps.append
    return sleeps


# --------------------------------------------------------------------------- the declaration


@pytest.mark.parametrize("family", BY_NAME)
def test_the_family_is_its_package_and_its_kinds(family: ProviderFamily) -> None:
    """``FAMILY`` lives in ``reconcile.providers.<name>``; its kinds are the registered ones, of
    its provider (``jobs.provider``); its scheme is served on ``/webhooks/<name>``; a family with
    an async kind has webhooks."""
    assert importlib.import_module(f"reconcile.providers.{family.name}").FAMILY is family
    for kind in family.kinds:
        assert get_kind(kind.name) is kind and provider_of(kind.name) == family.name
    assert webhooks.get_scheme(family.name) is family.webhook
    if any(not kind.sync for kind in family.kinds):
        assert family.webhook is not None and family.name in webhooks.PROVIDERS


def test_every_registered_kind_is_a_familys() -> None:
    """No built-in kind escapes this contract."""
    assert {k.name for k in all_kinds()} == {k.name for f in FAMILIES for k in f.kinds}


@pytest.mark.parametrize("family", BY_NAME)
def test_its_simulator_serves_it(family: ProviderFamily, simulator: Simulator) -> None:
    """The declared simulator module loaded and registered the family's route (its prefix is
    the family's name), pointing every URL setting at it and filling every other setting; an
    example request of each kind; the kinds the chaos run mixes in; and, with webhooks, a signer
    and the setting its deliveries are verified with."""
    assert family.simulator is not None
    assert family.name not in sim_registry.missing(), sim_registry.missing()[family.name]
    route = sim_registry.route(family.name)
    assert route is not None
    routed = {s for r in sim_registry.routes() for s in r.url_settings}
    assert set(family.urls) <= routed
    hooks = sim_registry.webhooks_for(family.name)
    filled = {s for r in sim_registry.routes() for s in r.api_key_settings}
    filled |= {hooks.secret_setting} if hooks is not None and hooks.secret_setting else set()
    assert set(family.secrets) | set(family.settings) <= filled
    env = simulator.env()
    assert {sim_registry.env_name(s) for s in family.setting_fields} <= set(env)
    assert set(sim_registry.examples()) >= {k.name for k in family.kinds}
    assert route.chaos and set(route.chaos) <= {k.name for k in family.kinds}
    if family.webhook is not None:
        assert hooks is not None and hooks.sign is not None
        assert hooks.secret_setting in family.setting_fields


# --------------------------------------------------------------------------- async kinds


@pytest.mark.parametrize(("family", "kind"), ASYNC)
def test_run_reports_the_task_once_before_the_first_poll(
        simulator: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """create → ``on_task_created(task_id)`` exactly once, before any status read → polls to
    success with every output (a URL, or text in hand); created upstream once."""
    client = _async(kind, simulator)
    job_id = str(uuid.uuid4())
    simulator.script(job_id, Script(timeline=((0.0, "queued"), (0.2, "running"),
                                              (0.4, "succeeded")), outputs=2))
    events: list[str] = []

    class Spy:
        name = client.name

        def create(self, request: CreateRequest) -> Any:
            events.append("create")
            return client.create(request)

        def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
            events.append("poll")
            return client.poll(task_id, model=model)

    result = run(Spy(), _request(family, kind, job_id),  # type: ignore[arg-type]
                 on_task_created=lambda task_id: events.append(f"saved:{task_id}"),
                 interval=0.1, max_polls=100)
    assert result.status is PollStatus.SUCCEEDED, result
    saved = [e for e in events if e.startswith("saved:")]
    assert len(saved) == 1 and events[:2] == ["create", saved[0]], events
    assert simulator.creates(job_id) == 1
    assert result.outputs and all(o.url or o.text for o in result.outputs)


@pytest.mark.parametrize(("family", "kind"), ASYNC)
def test_run_without_a_callback_and_resume(
        simulator: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """``run`` needs no callback; ``resume`` polls an existing task id to its end."""
    client = _async(kind, simulator)
    job_id = str(uuid.uuid4())
    simulator.script(job_id, Script(timeline=INSTANT))
    request = _request(family, kind, job_id)
    first = run(client, request, interval=0.05, max_polls=100)
    assert first.status is PollStatus.SUCCEEDED, first
    task = simulator.tasks_for(job_id)[0]
    again = resume(client, task.task_id, model=request.model, interval=0.05, max_polls=100)
    assert again.status is PollStatus.SUCCEEDED and len(again.outputs) == len(first.outputs) > 0


@pytest.mark.parametrize(("family", "kind"), ASYNC)
def test_failure_and_vanished_tasks_are_normalised(
        simulator: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """A failed task polls as FAILED; a vanished one as NOT_FOUND."""
    client = _async(kind, simulator)
    for state, expect in (("failed", PollStatus.FAILED), ("vanished", PollStatus.NOT_FOUND)):
        job_id = str(uuid.uuid4())
        simulator.script(job_id, Script(timeline=((0.0, "queued"), (0.0, state))))
        request = _request(family, kind, job_id)
        created = client.create(request)
        assert client.poll(created.task_id, model=request.model).status is expect, state


@pytest.mark.parametrize(("family", "kind"), ASYNC)
def test_dropped_connection_after_accept_is_uncertain(
        simulator: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """The provider accepted, then the connection dropped: CreateUncertain (and it exists
    upstream)."""
    client = _async(kind, simulator)
    job_id = str(uuid.uuid4())
    simulator.script(job_id, Script(create="drop_after_accept"))
    with pytest.raises(CreateUncertain):
        client.create(_request(family, kind, job_id))
    assert simulator.creates(job_id) == 1


@pytest.mark.parametrize(("family", "kind"), ASYNC)
def test_429_on_create_is_rate_limited_not_created(
        simulator: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """A 429 is CreateRateLimited with Retry-After, and nothing is created."""
    client = _async(kind, simulator)
    job_id = str(uuid.uuid4())
    simulator.script(job_id, Script(create="rate_limit", retry_after=7))
    with pytest.raises(CreateRateLimited) as info:
        client.create(_request(family, kind, job_id))
    assert info.value.retry_after == 7 and simulator.creates(job_id) == 0


@pytest.mark.parametrize(("family", "kind"), ASYNC)
def test_validation_rejection_is_invalid_input(
        simulator: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """A validation error is a confirmed rejection with UPSTREAM_INVALID_INPUT."""
    client = _async(kind, simulator)
    job_id = str(uuid.uuid4())
    simulator.script(job_id, Script(create="reject_invalid"))
    with pytest.raises(CreateRejected) as info:
        client.create(_request(family, kind, job_id))
    assert info.value.code == ErrorCode.UPSTREAM_INVALID_INPUT and simulator.creates(job_id) == 0


@pytest.mark.parametrize(("family", "kind"), ASYNC)
def test_a_create_answered_5xx_is_sent_once(
        simulator: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """A create is never retried, whatever the answer (no blind resubmission)."""
    client = _async(kind, simulator)
    sleeps = _quiet(client)
    job_id = str(uuid.uuid4())
    simulator.script(job_id, Script(create="server_error"))
    with pytest.raises((CreateUncertain, CreateRejected)):
        client.create(_request(family, kind, job_id))
    assert simulator.attempts(job_id) == 1 and simulator.creates(job_id) == 0 and sleeps == []


@pytest.mark.parametrize("error", TRANSPORT, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize(("family", "kind"), ASYNC)
def test_a_transport_failure_on_create_is_uncertain_and_not_retried(
        simulator: Simulator, family: ProviderFamily, kind: Kind, error: Exception) -> None:
    """A timeout or dropped connection on create leaves the outcome unknown: uncertain, and the
    create went out once."""
    faults = Faults(error=error, methods=("POST",))
    client = _async(kind, simulator, _faulty(faults))
    with pytest.raises(CreateUncertain):
        client.create(_request(family, kind, str(uuid.uuid4())))
    assert faults.seen == ["POST"]


@pytest.mark.parametrize(("family", "kind"), ASYNC)
def test_reads_are_retried_on_5xx_and_429_honouring_retry_after(
        simulator: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """A status read retries a 503 and a 429 (waiting its Retry-After) and returns the eventual
    answer: one read, three exchanges."""
    faults = Faults()
    client = _async(kind, simulator, _faulty(faults))
    sleeps = _quiet(client)
    job_id = str(uuid.uuid4())
    simulator.script(job_id, Script(timeline=((0.0, "queued"), (0.0, "running"))))
    request = _request(family, kind, job_id)
    created = client.create(request)
    faults.seen.clear()
    faults.statuses = [503, 429]
    assert client.poll(created.task_id, model=request.model).status is PollStatus.RUNNING
    assert faults.seen == ["GET"] * 3 and len(sleeps) == 2 and sleeps[1] == 2.0


@pytest.mark.parametrize(("family", "kind"), ASYNC)
def test_reads_that_keep_failing_raise_read_failed(
        simulator: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """A read failing at the transport level on every attempt (one and three retries) raises
    ReadFailed, never a status."""
    faults = Faults(error=requests.ConnectionError("down"))
    client = _async(kind, simulator, _faulty(faults))
    sleeps = _quiet(client)
    model, _ = _example(family, kind)
    with pytest.raises(ReadFailed):
        client.poll("a-task-id", model=model)
    assert faults.seen == ["GET"] * 4 and len(sleeps) == 3


@pytest.mark.parametrize(("family", "kind"), ASYNC)
def test_reads_answered_5xx_every_time_raise_read_failed(
        simulator: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """A read that keeps answering 500 ends in ReadFailed after its retries, not a status."""
    faults = Faults(statuses=(500,) * 4)
    client = _async(kind, simulator, _faulty(faults))
    _quiet(client)
    model, _ = _example(family, kind)
    with pytest.raises(ReadFailed):
        client.poll("a-task-id", model=model)
    assert faults.seen == ["GET"] * 4


@pytest.fixture
def every_webhook_url(simulator: Simulator) -> Iterator[Simulator]:
    """The simulator with every workspace-wide webhook URL it has set (a provider that sends to
    one URL per account rather than to the callback planted in the create)."""
    simulator.configure(**{knob: "https://platform.example/hooks/webhooks/workspace"
                           for knob in CONFIG if knob.endswith("_webhook_url")})
    yield simulator


@pytest.mark.parametrize(("family", "kind"), ASYNC)
def test_the_simulators_delivery_verifies_with_the_familys_scheme(
        every_webhook_url: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """What the family's simulator module sends when a task ends verifies with the family's
    scheme (its secret as the simulator's settings hold it), names the task and the job, and is
    never read as a failure (None: the delivery does not say, as an ElevenLabs dubbing event)."""
    sim = every_webhook_url
    assert family.webhook is not None
    hooks = sim_registry.webhooks_for(family.name)
    assert hooks is not None
    client = _async(kind, sim)
    job_id = str(uuid.uuid4())
    sim.script(job_id, Script(timeline=INSTANT, webhook=True))
    created = client.create(_request(family, kind, job_id))
    task = sim.tasks[created.task_id]
    delivery = hooks.callback(sim, task, "succeeded", task.created_at)
    assert delivery is not None
    settings = sim.settings()
    event = webhooks.verify(family.name, delivery.headers, delivery.body,
                            dict(parse_qsl(urlsplit(delivery.url).query)),
                            sim_registry.verify_key(family.name, sim), datetime.now(UTC),
                            **family.webhook.options(settings))
    assert event.provider == family.name and event.task_id == created.task_id
    assert event.succeeded is not False and event.failed is not True
    assert event.planted_job_id == job_id


# --------------------------------------------------------------------------- sync kinds


def _sync(kind: Kind, sim: Simulator, session: requests.Session | None = None) -> SyncProvider:
    client = kind.build(sim.settings(), session)
    assert isinstance(client, SyncProvider), kind.name
    return client


@pytest.mark.parametrize(("family", "kind"), SYNC)
def test_sync_kinds_answer_in_one_call(
        simulator: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """Sync kinds return their output in one request."""
    model, inp = _example(family, kind)
    result = _sync(kind, simulator).call(model, inp)
    assert result.outputs and (result.outputs[0].text or result.outputs[0].data)
    assert simulator.attempts(provider=family.name) == 1


@pytest.mark.parametrize(("family", "kind"), SYNC)
def test_a_sync_call_answered_5xx_fails_once(
        simulator: Simulator, family: ProviderFamily, kind: Kind) -> None:
    """A failed sync call is a SyncCallFailed, sent once (the platform's request decides)."""
    model, inp = _example(family, kind)
    simulator.script_default(Script(create="server_error"))
    client = _sync(kind, simulator)
    sleeps = _quiet(client)
    with pytest.raises(SyncCallFailed):
        client.call(model, inp)
    assert simulator.attempts(provider=family.name) == 1 and sleeps == []


@pytest.mark.parametrize(("error", "code"), [
    (requests.ReadTimeout("slow"), ErrorCode.UPSTREAM_TIMEOUT),
    (requests.ConnectTimeout("connect"), ErrorCode.UPSTREAM_TIMEOUT),
    (requests.ConnectionError("reset"), ErrorCode.UPSTREAM_FAILED),
], ids=["ReadTimeout", "ConnectTimeout", "ConnectionError"])
@pytest.mark.parametrize(("family", "kind"), SYNC)
def test_sync_transport_failures(simulator: Simulator, family: ProviderFamily, kind: Kind,
                                 error: Exception, code: ErrorCode) -> None:
    """A timeout is UPSTREAM_TIMEOUT; another transport error is UPSTREAM_FAILED; sent once."""
    model, inp = _example(family, kind)
    faults = Faults(error=error, methods=("POST",))
    with pytest.raises(SyncCallFailed) as info:
        _sync(kind, simulator, _faulty(faults)).call(model, inp)
    assert info.value.code is code and faults.seen == ["POST"]
