"""What the simulator serves, as each provider module registers it.

A ``sim_<provider>`` module registers its :class:`SimRoute` (the path prefix it answers under,
who may call it, its error answer, its handler) and, when the provider sends webhooks, its
:class:`SimWebhooks` (the callback that builds and signs one delivery, with the provider's
signer from :mod:`.sim_signing`). :class:`~reconcile.testing.simulator.Simulator` dispatches
through this registry, so a platform's tests can serve their own provider family too: register
a route (and webhooks) before starting the simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .sim_core import Request, Response, Script, Task
    from .sim_signing import Delivery
    from .simulator import Simulator


@dataclass(frozen=True)
class SimRoute:
    """One path prefix: ``{url}/{prefix}/…`` is answered by ``handle`` (None: no such route)."""

    prefix: str
    authorized: Callable[[Request], bool]
    error: Callable[[str, Script], Response]  # ("auth" / "server_error" / …, the script)
    handle: Callable[[Simulator, Request], Response | None]


@dataclass(frozen=True)
class SimWebhooks:
    """One provider's deliveries: ``callback`` builds the signed delivery of a task that reached
    a terminal state (None: nothing to send), signing with ``signer``."""

    provider: str  # Task.provider
    callback: Callable[[Simulator, Task, str, float], Delivery | None]
    signer: Callable[..., dict[str, str]]


_ROUTES: dict[str, SimRoute] = {}
_WEBHOOKS: dict[str, SimWebhooks] = {}


def register_route(route: SimRoute) -> SimRoute:
    _ROUTES[route.prefix] = route
    return route


def register_webhooks(webhooks: SimWebhooks) -> SimWebhooks:
    _WEBHOOKS[webhooks.provider] = webhooks
    return webhooks


def unregister(prefix: str | None = None, provider: str | None = None) -> None:
    if prefix is not None:
        _ROUTES.pop(prefix, None)
    if provider is not None:
        _WEBHOOKS.pop(provider, None)


def route(prefix: str) -> SimRoute | None:
    return _ROUTES.get(prefix)


def webhooks_for(provider: str) -> SimWebhooks | None:
    return _WEBHOOKS.get(provider)


def prefixes() -> tuple[str, ...]:
    return tuple(_ROUTES)


__all__ = ["SimRoute", "SimWebhooks", "prefixes", "register_route", "register_webhooks",
           "route", "unregister", "webhooks_for"]
