"""The real provider clients drive the simulator over loopback HTTP, for every kind."""

from __future__ import annotations

import uuid

import pytest

from reconcile.errors import CreateRateLimited, CreateRejected, CreateUncertain, ErrorCode
from reconcile.kinds import all_kinds, get_kind
from reconcile.providers.base import AsyncProvider, CreateRequest, PollStatus, SyncProvider, run
from reconcile.testing import sim_registry
from reconcile.testing.simulator import Script, Simulator

# kind → (model, input): the example each simulator module registers for the kinds it serves
EXAMPLES = sim_registry.examples()
ASYNC = {name: ex for name, ex in EXAMPLES.items()
         if (k := get_kind(name)) is not None and not k.sync}
SYNC = {name: ex for name, ex in EXAMPLES.items() if (k := get_kind(name)) is not None and k.sync}


def test_every_builtin_kind_is_covered_here() -> None:
    """No kind escapes this integration test."""
    assert set(ASYNC) | set(SYNC) == {k.name for k in all_kinds()}


def _request(kind: str, job_id: str) -> CreateRequest:
    model, inp = ASYNC[kind]
    extra = {"destination": "owner/trained"} if kind == "replicate-training" else {}
    return CreateRequest(model=model, input=inp, job_id=job_id,
                         webhook_url=f"https://platform.example/hooks/x?job_id={job_id}", extra=extra)


@pytest.mark.parametrize("kind", sorted(ASYNC))
def test_async_kind_runs_create_hook_poll_to_success(simulator: Simulator, kind: str) -> None:
    """create → on_task_created once → polls to success with every output's URL."""
    k = get_kind(kind)
    assert k is not None
    client = k.build(simulator.settings())
    assert isinstance(client, AsyncProvider)
    job_id = str(uuid.uuid4())
    simulator.script(job_id, Script(timeline=((0.0, "queued"), (0.2, "running"), (0.4, "succeeded")),
                                    outputs=2))
    seen: list[str] = []
    result = run(client, _request(kind, job_id), on_task_created=seen.append, interval=0.1,
                 max_polls=100)
    assert result.status is PollStatus.SUCCEEDED, result
    assert len(seen) == 1 and simulator.creates(job_id) == 1
    assert result.outputs and all(o.url or o.text for o in result.outputs)


@pytest.mark.parametrize("kind", ["kie-standard", "replicate-prediction", "fal-queue", "elevenlabs-async"])
def test_failure_and_vanished_tasks_are_normalised(simulator: Simulator, kind: str) -> None:
    """A failed task polls as FAILED; a vanished one as NOT_FOUND."""
    k = get_kind(kind)
    client = k.build(simulator.settings())  # type: ignore[union-attr]
    for state, expect in (("failed", PollStatus.FAILED), ("vanished", PollStatus.NOT_FOUND)):
        job_id = str(uuid.uuid4())
        simulator.script(job_id, Script(timeline=((0.0, "queued"), (0.0, state))))
        created = client.create(_request(kind, job_id))  # type: ignore[union-attr]
        assert client.poll(created.task_id, model=ASYNC[kind][0]).status is expect  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", sorted(ASYNC))
def test_dropped_connection_after_accept_is_uncertain(simulator: Simulator, kind: str) -> None:
    """The provider accepted, then the connection dropped: CreateUncertain (and it exists upstream)."""
    client = get_kind(kind).build(simulator.settings())  # type: ignore[union-attr]
    job_id = str(uuid.uuid4())
    simulator.script(job_id, Script(create="drop_after_accept"))
    with pytest.raises(CreateUncertain):
        client.create(_request(kind, job_id))  # type: ignore[union-attr]
    assert simulator.creates(job_id) == 1


@pytest.mark.parametrize("kind", sorted(ASYNC))
def test_429_on_create_is_rate_limited_not_created(simulator: Simulator, kind: str) -> None:
    """A 429 is CreateRateLimited with Retry-After, and nothing is created."""
    client = get_kind(kind).build(simulator.settings())  # type: ignore[union-attr]
    job_id = str(uuid.uuid4())
    simulator.script(job_id, Script(create="rate_limit", retry_after=7))
    with pytest.raises(CreateRateLimited) as info:
        client.create(_request(kind, job_id))  # type: ignore[union-attr]
    assert info.value.retry_after == 7 and simulator.creates(job_id) == 0


@pytest.mark.parametrize("kind", ["kie-standard", "replicate-prediction", "fal-queue"])
def test_validation_rejection_is_invalid_input(simulator: Simulator, kind: str) -> None:
    """A 400/422 validation error is a confirmed rejection with UPSTREAM_INVALID_INPUT."""
    client = get_kind(kind).build(simulator.settings())  # type: ignore[union-attr]
    job_id = str(uuid.uuid4())
    simulator.script(job_id, Script(create="reject_invalid"))
    with pytest.raises(CreateRejected) as info:
        client.create(_request(kind, job_id))  # type: ignore[union-attr]
    assert info.value.code == ErrorCode.UPSTREAM_INVALID_INPUT and simulator.creates(job_id) == 0


@pytest.mark.parametrize("kind", sorted(SYNC))
def test_sync_kinds_answer_in_one_call(simulator: Simulator, kind: str) -> None:
    """Sync kinds return their output in one request."""
    client = get_kind(kind).build(simulator.settings())  # type: ignore[union-attr]
    assert isinstance(client, SyncProvider)
    model, inp = SYNC[kind]
    result = client.call(model, inp)
    assert result.outputs and (result.outputs[0].text or result.outputs[0].data)
