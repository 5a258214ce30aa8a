"""Internal: What every provider client returns, and the shape every client has.

A client is built per provider from :class:`~reconcile.settings.Settings` and an injected
``requests.Session``; it is stateless otherwise. Async clients implement
:class:`AsyncProvider`, sync ones :class:`SyncProvider`. The module-level :func:`run` and
:func:`resume` give ``run…`` (create, then ``on_task_created``, then poll) and ``resume…``
(poll a saved task id) for any async client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "AsyncProvider", "CreateRequest", "Created", "ListedTask", "OnTaskCreated", "Output",
    "PollResult", "PollStatus", "SyncProvider", "SyncResult", "resume", "run",
]


class PollStatus(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    UNKNOWN = "unknown"  # a status value the adapter does not recognise
    NOT_FOUND = "not_found"  # the provider does not know the task (any more)


@dataclass(frozen=True)
class Output:
    """One output of a job: a URL to fetch, or (sync calls) bytes or text in hand."""

    url: str | None = None
    media_type: str | None = None
    data: bytes | None = None
    text: str | None = None


@dataclass(frozen=True)
class Created:
    """An accepted submission: the upstream id, exactly as the provider returned it."""

    task_id: str
    request_id: str | None = None
    raw: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class PollResult:
    """One normalised status read."""

    status: PollStatus
    progress: int | None = None
    outputs: tuple[Output, ...] = ()
    raw_status: str | None = None
    error_code: str | None = None  # the provider's own failure code, as returned
    error_message: str | None = None
    request_id: str | None = None
    cost_usd: Decimal | None = None
    planted_job_id: str | None = None  # the job id the provider echoes back, when it does
    raw: Mapping[str, Any] | None = None

    @property
    def terminal(self) -> bool:
        return self.status in (PollStatus.SUCCEEDED, PollStatus.FAILED, PollStatus.CANCELED)


@dataclass(frozen=True)
class SyncResult:
    """The answer of a synchronous call."""

    outputs: tuple[Output, ...] = ()
    request_id: str | None = None
    cost_usd: Decimal | None = None
    raw: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ListedTask:
    """A task found by a provider listing (evidence for an uncertain submission)."""

    task_id: str
    created_at: datetime | None
    planted_job_id: str | None


# The library's prefix on a text field it plants a job id in (an ElevenLabs dubbing's ``name``):
# no customer input may use it (README "Webhook fields that are trusted").
JOB_REF_PREFIX = "reconcile-job:"


@dataclass(frozen=True)
class CreateRequest:
    """What the lifecycle hands a client to create one upstream task."""

    model: str
    input: Mapping[str, Any]
    job_id: str
    webhook_url: str | None = None  # the job id is planted in its query string
    extra: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class AsyncProvider(Protocol):
    """A submit-and-poll provider (one upstream task per job)."""

    name: str

    def create(self, request: CreateRequest) -> Created:
        """Submit once. Never retried here; raises CreateRejected / CreateRateLimited /
        CreateUncertain."""
        ...

    def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
        """One status read (reads are retried on 429/5xx inside). Raises ReadFailed.

        ``model`` is the model the task was created with (fal needs it to build its URLs)."""
        ...

    def cancel(self, task_id: str, *, model: str | None = None) -> bool:
        """Ask the provider to cancel; False where the provider has no cancel endpoint."""
        ...

    def find_created(self, job_id: str, created_after: datetime) -> ListedTask | None:
        """Evidence search: the task created for ``job_id`` after ``created_after``, found by a
        provider listing, or None (also where the provider has no listing)."""
        ...


@runtime_checkable
class SyncProvider(Protocol):
    """A provider answered in one request."""

    name: str

    def call(self, model: str, input: Mapping[str, Any]) -> SyncResult:
        """Raises SyncCallFailed (with the outcome table's code) on any failure."""
        ...


OnTaskCreated = Callable[[str], None]


def unwrap_sdk(payload: Any) -> tuple[Any, str | None]:
    """Unwrap the SDK-style ``{"data": …, "requestId": …}`` wrapper (README, Design notes: The SDK
    result wrapper).

    Returns ``(payload, request_id)``: the inner ``data`` and its request id when ``payload`` is
    exactly such a wrapper, else ``payload`` unchanged and None. Every adapter calls this before
    looking for media, so a wrapped success is never read as an empty result.
    """
    if (
        isinstance(payload, Mapping)
        and "data" in payload
        and "requestId" in payload
        and set(payload) <= {"data", "requestId"}
    ):
        request_id = payload.get("requestId")
        return payload["data"], request_id if isinstance(request_id, str) else None
    return payload, None


def run(
    client: AsyncProvider,
    request: CreateRequest,
    *,
    on_task_created: OnTaskCreated | None = None,
    interval: float = 5.0,
    max_polls: int = 720,
    sleep: Callable[[float], None] = time.sleep,
) -> PollResult:
    """create → ``on_task_created(task_id)`` (exactly once, before any poll) → poll to the end.

    For scripts and simple callers; the Celery lifecycle polls one read per task instead.
    """
    created = client.create(request)
    if on_task_created is not None:
        on_task_created(created.task_id)
    return resume(
        client, created.task_id, model=request.model, interval=interval, max_polls=max_polls,
        sleep=sleep,
    )


def resume(
    client: AsyncProvider,
    task_id: str,
    *,
    model: str | None = None,
    interval: float = 5.0,
    max_polls: int = 720,
    sleep: Callable[[float], None] = time.sleep,
) -> PollResult:
    """Poll an existing upstream task until it is terminal (or ``max_polls`` reads)."""
    result = client.poll(task_id, model=model)
    for _ in range(max_polls - 1):
        if result.terminal or result.status is PollStatus.NOT_FOUND:
            return result
        sleep(interval)
        result = client.poll(task_id, model=model)
    return result


from ..core.facade import names_moved as _names_moved  # noqa: E402

_names_moved(__name__)
