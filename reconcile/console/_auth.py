"""Internal: who may use the console — the platform's authorization hook, the ``--dev`` one-time
token, and the CSRF token every form carries.

The hook is the platform's: a callable from the request to an :class:`OperatorIdentity` (its
name and its permissions: read, act) or None (not an operator: 403). The console keeps no
users or passwords of its own. With no hook configured every request is refused (403) with a
page saying how to configure one.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: the setting naming the standalone server's hook, ``module:callable``
AUTH_SETTING = "RECONCILE_CONSOLE_AUTH"
#: the setting holding the CSRF secret when several server processes serve one console
SECRET_SETTING = "RECONCILE_CONSOLE_SECRET"
CSRF_COOKIE = "reconcile_console_csrf"
DEV_COOKIE = "reconcile_console_dev"
CSRF_FIELD = "csrf"


@dataclass(frozen=True)
class OperatorIdentity:
    """An operator as the platform vouches for it: the ``name`` recorded with every action it
    takes, whether it may read the console (``can_read``) and act on jobs (``can_act``), each
    True or False (anything else raises ValueError: the hook then vouches for nobody)."""

    name: str
    can_read: bool = True
    can_act: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError("an operator identity needs a name")
        # a permission is True or False: "no" (a setting read as text) is truthy, so anything
        # else fails closed, as a hook that raises does
        if not isinstance(self.can_read, bool) or not isinstance(self.can_act, bool):
            raise ValueError("an operator identity's can_read and can_act are True or False")


Authorize = Callable[[Any], Any]  # (starlette Request) -> OperatorIdentity | None (or awaitable)


def load_authorizer(spec: str) -> Authorize:
    """The hook a setting names, ``package.module:callable`` (ValueError: not that form, or it
    does not name a callable)."""
    module_name, sep, attr = (spec or "").strip().partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{AUTH_SETTING}={spec!r}: expected 'package.module:callable'")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ValueError(f"{AUTH_SETTING}={spec!r}: {module_name} has no {attr}")
    if not callable(target):
        raise ValueError(f"{AUTH_SETTING}={spec!r} is not callable")
    return target  # type: ignore[no-any-return]


class DevLogin:
    """``reconcile console --dev``: one token, printed once, exchanged once (``/login?token=``)
    for a session cookie; every request after that carries the cookie. For a quick look on a
    laptop (loopback only); anywhere else, the platform's hook."""

    def __init__(self, operator: str = "dev") -> None:
        self.token: str | None = secrets.token_urlsafe(24)
        self.identity = OperatorIdentity(f"{operator} (console --dev)", True, True)
        self._sessions: set[str] = set()
        self._lock = threading.Lock()

    def exchange(self, token: str | None) -> str | None:
        """The session for the one-time token (None: wrong, or used already)."""
        with self._lock:
            if self.token is None or not token or not _same(self.token, token):
                return None
            self.token = None
            session = secrets.token_urlsafe(32)
            self._sessions.add(session)
            return session

    def __call__(self, request: Any) -> OperatorIdentity | None:
        session = request.cookies.get(DEV_COOKIE)
        with self._lock:
            return self.identity if session and session in self._sessions else None


class Csrf:
    """Double-submit tokens bound to the operator: a random per-browser cookie (HttpOnly,
    ``SameSite=Strict``) and, in each form, an HMAC of that cookie and the operator's name under
    the console's secret. A POST without both, or with a token made for another cookie or
    another operator, is refused."""

    def __init__(self, secret: bytes | str | None = None) -> None:
        if isinstance(secret, str):
            secret = secret.encode()
        self.secret = secret or secrets.token_bytes(32)

    @staticmethod
    def new_cookie() -> str:
        return secrets.token_urlsafe(32)

    def token(self, cookie: str, operator: str) -> str:
        message = f"{cookie}\n{operator}".encode("utf-8", "surrogatepass")
        return hmac.new(self.secret, message, hashlib.sha256).hexdigest()

    def valid(self, cookie: str | None, operator: str, token: str | None) -> bool:
        if not cookie or not token:
            return False
        return _same(self.token(cookie, operator), token)


def _same(expected: str, given: str) -> bool:
    """A constant-time comparison of any text a request carries (``hmac.compare_digest``
    raises on non-ASCII text: compared as UTF-8 bytes, never an error)."""
    return hmac.compare_digest(expected.encode("utf-8", "surrogatepass"),
                               given.encode("utf-8", "surrogatepass"))


NOT_CONFIGURED = f"""\
The operator console has no authorization hook, so it refuses every request.

Mounted in a platform's app: pass the hook in code, a callable from the request to an
OperatorIdentity(name, can_read, can_act), or None for "not an operator":

    from reconcile.console import OperatorIdentity, create_app

    def authorize(request):
        user = my_platform_user(request)          # the platform's own authentication
        if user is None or not user.is_staff:
            return None
        return OperatorIdentity(user.email, can_read=True, can_act=user.is_superuser)

    app.mount("/ops", create_app(authorize=authorize))

Standalone (reconcile console --port N): name the hook in the setting
{AUTH_SETTING}=package.module:callable.

For a quick look on a laptop: reconcile console --dev (loopback only, one-time token)."""
