"""The operator console: the jobs that need a person, each with its whole story and the one
safe action, in a browser (optional extra ``console``: ``pip install 'reconcile[console]'``).

A mountable ASGI app, server-rendered HTML that works with JavaScript off. A platform mounts it
under a path of its own, behind its own authentication::

    from reconcile.console import OperatorIdentity, create_app

    def authorize(request):                 # the platform's: request -> identity or None
        user = current_staff_user(request)
        if user is None:
            return None
        return OperatorIdentity(user.email, can_read=True, can_act=user.is_superuser)

    app.mount("/ops", create_app(runtime, authorize=authorize))

Pages: needs attention (uncertain, stuck, past the horizon, unsettled, open anomalies; filters
by kind, age and user; keyset pages), a job's story, a user's ledger, the audit, health. The
actions (resolve with an upstream id, resolve as not submitted, fail, retry a settlement,
release an orphan) are forms that call :func:`reconcile.operator.run` — the CLI's function —
with the operator's identity and a typed reason, through a CSRF token.

With no hook every request is answered 403 with a page saying how to configure one. The
standalone server is ``reconcile console --port N`` (the hook named by
``RECONCILE_CONSOLE_AUTH=package.module:callable``) or ``reconcile console --dev`` (loopback
only, a one-time token).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

# DevLogin: the `reconcile console --dev` server's one-time login (the CLI's; not exported)
from ._auth import AUTH_SETTING, DevLogin as DevLogin, OperatorIdentity, load_authorizer

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from ..runtime import Runtime

__all__ = ["AUTH_SETTING", "OperatorIdentity", "create_app", "load_authorizer"]


def create_app(rt: Runtime | None = None, *, authorize: Callable[[Any], Any] | None = None,
               secret: bytes | str | None = None,
               runtime_factory: Callable[[], Runtime] | None = None,
               dev: Any = None) -> Starlette:
    """The console as an ASGI app (Starlette), to mount or serve.

    ``rt``: the runtime it reads and acts through (else ``runtime_factory()`` on first use,
    else the one built from the ``RECONCILE_*`` settings). ``authorize``: the platform's hook,
    ``(request) -> OperatorIdentity | None`` (sync or async); None: every request is refused.
    ``secret``: the CSRF tokens' key (default: ``RECONCILE_CONSOLE_SECRET``, else random per
    process — set it when several processes serve one console). ``dev``: the ``--dev``
    server's one-time login (internal)."""
    import os

    from ._app import Console, build_app
    from ._auth import SECRET_SETTING

    if rt is None and runtime_factory is None:
        runtime_factory = _runtime_from_settings
    secret = secret or os.environ.get(SECRET_SETTING) or None
    return build_app(Console(rt, runtime_factory, authorize, secret, dev))


def _runtime_from_settings() -> Runtime:
    """What ``reconcile`` builds: the settings' database, enqueues through the broker."""
    from ..ops.app import Cli

    return Cli().runtime()
