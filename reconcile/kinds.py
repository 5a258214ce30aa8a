"""The ``provider_kind`` registry (DESIGN.md §3).

A kind says whether the call is sync or async, how long before a job of that kind is stale,
how often to poll, how long its result URLs live, where the job id is planted for the provider
to echo back, and how to build its client. A platform registers its own with
:func:`register_kind`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import requests

    from .providers.base import AsyncProvider, SyncProvider
    from .settings import Settings

ClientFactory = Callable[["Settings", "requests.Session | None"], Any]

MIN = timedelta(minutes=1)
SEC = timedelta(seconds=1)


@dataclass(frozen=True)
class Kind:
    name: str
    sync: bool
    stale_threshold: timedelta
    poll_interval: timedelta | None
    # None: no URL to fetch (sync) or unbounded (ElevenLabs: while the dubbing exists)
    result_url_lifetime: timedelta | None
    plant: str | None  # where the job id is planted for the provider to echo it back
    client: str  # "module:factory" resolved lazily, or set ``factory``
    factory: ClientFactory | None = field(default=None, compare=False)
    # (after, interval): poll less often as a job ages (KIE: 2–3 s early, 15–30 s later)
    backoff: tuple[tuple[timedelta, timedelta], ...] = ()

    def build(self, settings: Settings, session: requests.Session | None = None) -> AsyncProvider | SyncProvider:
        factory = self.factory
        if factory is None:
            module_name, _, attr = self.client.partition(":")
            factory = getattr(importlib.import_module(module_name), attr)
        return factory(settings, session)

    def interval_at(self, age: timedelta) -> timedelta:
        """The poll interval for a job that has been running ``age``."""
        for after, interval in self.interval_steps():
            if after is None or age >= after:
                return interval
        raise AssertionError("interval_steps ends with an unconditional step")

    def interval_steps(self) -> tuple[tuple[timedelta | None, timedelta], ...]:
        """``(age, interval)`` in the order they are tried: the first step whose age a job has
        reached applies (the last backoff entry reached wins); ``None``, last, is any age."""
        return (*((after, slower) for after, slower in reversed(self.backoff)),
                (None, self.poll_interval or timedelta(seconds=5)))


H24 = timedelta(hours=24)
H1 = timedelta(hours=1)
_KIE_BACKOFF = ((2 * MIN, 15 * SEC),)


def _kie(name: str, threshold: int, interval: int, api: str) -> Kind:
    return Kind(
        name=name,
        sync=False,
        stale_threshold=threshold * MIN,
        poll_interval=interval * SEC,
        result_url_lifetime=H24,
        plant="callBackUrl query",
        client=f"reconcile.providers.kie:{api}",
        backoff=_KIE_BACKOFF if interval < 15 else (),
    )


_BUILTIN: tuple[Kind, ...] = (
    _kie("kie-standard", 10, 5, "market_client"),
    _kie("kie-veo", 25, 10, "veo_client"),
    _kie("kie-suno", 30, 10, "suno_client"),
    _kie("kie-kontext", 10, 5, "kontext_client"),
    _kie("kie-luma", 25, 15, "luma_client"),
    _kie("kie-kling3", 25, 10, "market_client"),
    _kie("kie-runway", 25, 10, "runway_client"),
    _kie("kie-lip-sync", 75, 15, "market_client"),
    Kind("kie-llm", True, 5 * MIN, None, None, None, "reconcile.providers.kie:llm_client"),
    Kind("replicate-prediction", False, 20 * MIN, 3 * SEC, H1, "webhook query",
         "reconcile.providers.replicate:prediction_client"),
    Kind("replicate-training", False, 30 * MIN, 15 * SEC, H1, "webhook query",
         "reconcile.providers.replicate:training_client"),
    Kind("elevenlabs-async", False, 15 * MIN, 10 * SEC, None, "STT webhook_metadata",
         "reconcile.providers.elevenlabs:async_client"),
    Kind("elevenlabs-sync", True, 5 * MIN, None, None, None,
         "reconcile.providers.elevenlabs:sync_client"),
    Kind("anthropic-sync", True, 5 * MIN, None, None, None,
         "reconcile.providers.anthropic:sync_client"),
    Kind("fal-queue", False, 20 * MIN, 3 * SEC, H1, "fal_webhook query",
         "reconcile.providers.fal:queue_client"),
)

_REGISTRY: dict[str, Kind] = {k.name: k for k in _BUILTIN}

BUILTIN_KINDS: tuple[str, ...] = tuple(k.name for k in _BUILTIN)


def register_kind(kind: Kind, *, replace: bool = False) -> None:
    """Add a platform's own kind. Refuses to shadow an existing one unless ``replace``."""
    if kind.name in _REGISTRY and not replace:
        raise ValueError(f"provider kind {kind.name!r} is already registered")
    _REGISTRY[kind.name] = kind


def unregister_kind(name: str) -> None:
    _REGISTRY.pop(name, None)


def get_kind(name: str | None) -> Kind | None:
    """The kind named ``name``, or None when unknown (callers decide what unknown means)."""
    if name is None:
        return None
    return _REGISTRY.get(name)


def all_kinds() -> tuple[Kind, ...]:
    return tuple(_REGISTRY.values())
