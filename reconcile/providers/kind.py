"""Internal: the library's own mechanics, not an import path for platforms (may move).

One provider kind's declaration, :class:`Kind` (with :data:`ClientFactory` and
:func:`family_of_name`, its default family): declared by a provider family
(:mod:`reconcile.providers.family`, which re-exports all three), registered by
:mod:`reconcile.kinds`, and read by the webhook schemes' toolkit (:mod:`reconcile.providers.scheme`:
``same_kind(payload, kind)``), which the family declarations import. It sits below all three.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import requests

    from ..settings import Settings
    from .base import AsyncProvider, SyncProvider

ClientFactory = Callable[["Settings", "requests.Session | None"], Any]


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
    # The provider family: jobs.provider, the webhook path segment and the webhook scheme's
    # name. "" (the default) means the name's first "-" segment.
    provider: str = ""
    # Whether a stored delivery the provider's signature does not bind to a job may be bound by
    # a read of the task echoing the planted job id (KIE, ElevenLabs). None: the provider's
    # webhook scheme decides (:attr:`reconcile.webhooks.WebhookScheme.echo_check`).
    echo_check: bool | None = None
    # The binding fields: the create fields the library writes itself because the provider
    # echoes them back as what ties a delivery or a read to this job (README "Webhook fields
    # that are trusted"). An input setting one is refused at submit (:func:`binding_key`).
    # Every built-in kind declares its row (``()``: it plants nothing); None is a platform kind
    # that declares none.
    binds: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not self.provider:
            object.__setattr__(self, "provider", family_of_name(self.name))

    def build(self, settings: Settings, session: requests.Session | None = None) -> AsyncProvider | SyncProvider:
        factory = self.factory
        if factory is None:
            module_name, _, attr = self.client.partition(":")
            factory = getattr(importlib.import_module(module_name), attr)
        client: AsyncProvider | SyncProvider = factory(settings, session)
        return client

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


def family_of_name(name: str | None) -> str:
    """The default provider family of a kind name: its first ``-`` segment."""
    return (name or "").split("-", 1)[0]
