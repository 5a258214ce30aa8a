"""What the simulator serves, as each provider module registers it.

A ``sim_<provider>`` module registers its :class:`SimRoute` (the path prefix it answers under,
who may call it, its error answer, its handler, the settings that point a client at it, the
credential settings it expects, an example request of each kind it serves) and, when the
provider sends webhooks, its :class:`SimWebhooks` (the callback that builds and signs one
delivery, the setting the library verifies it with and the simulator's value for it, and a
signer for any body). That one registration is all the simulator needs: its dispatch, its
settings environment (:func:`~reconcile.testing.sim_core.base_urls_for`,
:meth:`~reconcile.testing.simulator.Simulator.env`, :class:`~reconcile.testing.sim_core.SimSecrets`)
and the library's own tests read this registry.

The built-in families' modules are loaded by :func:`load_builtin`: the ``simulator`` module each
family declares (``FAMILY.simulator``, :mod:`reconcile.providers.family`; a new built-in family
adds its module and lists nothing). The simulator itself loads them leniently: a module that is
missing or fails to import is recorded (:func:`missing`) and costs only that family — the
simulator serves nothing for it and points its URL settings at a path of its own that answers
404, never at the real provider. A platform's tests serve their own provider family too: import
the module that registers its route (and webhooks) before starting the simulator.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from .sim_signing import Delivery

    # The simulator (reconcile.testing.simulator) and its core types (reconcile.testing.sim_core)
    # import this registry: its callables name them, not importing them back
    Simulator: TypeAlias = Any
    Request: TypeAlias = Any
    Response: TypeAlias = Any
    Script: TypeAlias = Any
    SimSecrets: TypeAlias = Any
    Task: TypeAlias = Any

# (model, input): one request of a kind that the route accepts and runs to success
Example = tuple[str, Mapping[str, Any]]


@dataclass(frozen=True)
class SimRoute:
    """One path prefix: ``{url}/{prefix}/…`` is answered by ``handle`` (None: no such route).

    - ``url_settings``: each :class:`~reconcile.settings.Settings` field that points a client at
      this route, with the path below ``{url}/{prefix}`` it takes (``""``: the prefix itself);
    - ``api_key_settings``: the credential fields a client sends here (the simulator's
      environment fills each with a dummy key);
    - ``examples``: for each kind name this route serves, one request it accepts;
    - ``chaos``: the kinds the chaos run submits here, each with its weight in the mix.
    """

    prefix: str
    authorized: Callable[[Request], bool]
    error: Callable[[str, Script], Response]  # ("auth" / "server_error" / …, the script)
    handle: Callable[[Simulator, Request], Response | None]
    url_settings: Mapping[str, str] = field(default_factory=dict, compare=False)
    api_key_settings: tuple[str, ...] = ()
    examples: Mapping[str, Example] = field(default_factory=dict, compare=False)
    # kind → its weight in the chaos run's mix (each runs its example); none: not in the run
    chaos: Mapping[str, int] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class SimWebhooks:
    """One provider's deliveries: ``callback`` builds the signed delivery of a task that reached
    a terminal state (None: nothing to send), signing with ``signer``.

    - ``secret_setting``: the :class:`~reconcile.settings.Settings` field the library verifies
      these deliveries with (fal: the account id they are signed for);
    - ``secret``: the simulator's value for it, a string (or a callable reading it from
      :class:`~reconcile.testing.sim_core.SimSecrets`): the default that
      ``SimSecrets(webhook_secrets={provider: …})``, or ``SimSecrets(<secret_setting>=…)``,
      overrides;
    - ``sign(sim, body, timestamp)``: headers signing any ``body`` as the provider signs a
      delivery (the library's tests and fuzz sign with it);
    - ``verify_key(sim)``: the ``key`` :func:`reconcile.webhooks.verify` checks those with
      (None: the secret itself).
    """

    provider: str  # Task.provider
    callback: Callable[[Simulator, Task, str, float], Delivery | None]
    signer: Callable[..., dict[str, str]]
    secret_setting: str | None = None
    secret: str | Callable[[SimSecrets], str] | None = None
    sign: Callable[[Simulator, bytes, int], dict[str, str]] | None = None
    verify_key: Callable[[Simulator], Any] | None = None


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


def routes() -> tuple[SimRoute, ...]:
    """Every registered route, in registration order."""
    return tuple(_ROUTES.values())


def registered_webhooks() -> tuple[SimWebhooks, ...]:
    """Every provider's registered deliveries, in registration order."""
    return tuple(_WEBHOOKS.values())


def examples() -> dict[str, Example]:
    """Kind name → an example request, over every registered route."""
    return {kind: example for r in _ROUTES.values() for kind, example in r.examples.items()}


def sign(provider: str, sim: Simulator, body: bytes, timestamp: int) -> dict[str, str]:
    """``body`` signed as ``provider`` signs a delivery; LookupError when no simulator module
    registered a signer for it (never another provider's signature)."""
    hooks = _WEBHOOKS.get(provider)
    if hooks is None or hooks.sign is None:
        raise LookupError(f"no simulator signer is registered for provider {provider!r}")
    return hooks.sign(sim, body, timestamp)


def verify_key(provider: str, sim: Simulator) -> Any:
    """The ``key`` that verifies what :func:`sign` made for ``provider``; LookupError as there."""
    hooks = _WEBHOOKS.get(provider)
    if hooks is None or hooks.sign is None:
        raise LookupError(f"no simulator signer is registered for provider {provider!r}")
    return hooks.verify_key(sim) if hooks.verify_key is not None else \
        sim.secrets.webhook_secret(provider)


def env_name(setting: str) -> str:
    """The environment variable of a :class:`~reconcile.settings.Settings` field."""
    return "RECONCILE_" + setting.upper()


_MISSING: dict[str, str] = {}  # family → why its simulator module did not load


def load_builtin(*, strict: bool = True) -> tuple[ModuleType, ...]:
    """Import (once) the simulator module of every built-in provider family (``FAMILY.simulator``;
    each registers itself on import), in the families' order.

    ``strict`` (the default): a module that is missing (an install that lost it) or fails to
    import raises, rather than leave that family's settings unserved. Otherwise the failure is
    recorded for :func:`missing` and the other families' modules still load: what the simulator
    does at import, so one family's broken module fails that family's tests only."""
    from ..providers.family import families

    loaded = []
    for family in families():
        if family.simulator is None:
            continue
        try:
            loaded.append(importlib.import_module(family.simulator))
        except Exception as exc:
            if strict:
                raise
            _MISSING[family.name] = f"{family.simulator} did not import: {exc!r}"
        else:
            _MISSING.pop(family.name, None)
    return tuple(loaded)


def missing() -> dict[str, str]:
    """Built-in family → why its simulator module did not load (empty when every one did)."""
    return dict(_MISSING)


__all__ = ["Example", "SimRoute", "SimWebhooks", "env_name", "examples", "load_builtin",
           "missing", "prefixes", "register_route", "register_webhooks", "registered_webhooks",
           "route", "routes", "sign", "unregister", "verify_key", "webhooks_for"]
