"""acme's operator console at ``/ops``: the library's console (``reconcile.console``) behind a
demo authorization hook.

The hook is a stand-in for acme's real staff login, as ``X-User-Id`` is for its customers':
``ACME_OPERATORS`` lists acme's staff, ``name=act`` or ``name=read``, comma-separated (default
``ops@acme.test=act,viewer@acme.test=read``). A request names one with the ``X-Operator`` header
or the ``acme_operator`` cookie, which ``GET /ops-login?as=NAME`` sets for a browser. Both are
honoured from loopback only, for a request addressed to a loopback name: the demo hook vouches
for nobody on the network, nor for a page that rebinds its DNS name to 127.0.0.1. A real platform
asks its own session instead (see README, Operate with the console).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import PlainTextResponse, RedirectResponse

from reconcile.console import OperatorIdentity

DEFAULT_OPERATORS = "ops@acme.test=act,viewer@acme.test=read"
LOOPBACK = ("127.0.0.1", "::1")
COOKIE = "acme_operator"


def staff() -> dict[str, bool]:
    """acme's operators and whether each may act."""
    out: dict[str, bool] = {}
    for entry in (os.environ.get("ACME_OPERATORS") or DEFAULT_OPERATORS).split(","):
        name, _, permission = entry.strip().partition("=")
        if name:
            out[name] = permission.strip() == "act"
    return out


def _loopback(request: Any) -> bool:
    """From loopback, and addressed to a loopback name: a web page that points its own DNS name
    at 127.0.0.1 reaches the demo from the operator's browser (a loopback client) with any
    header it likes, but under its own name in ``Host``."""
    host = urlsplit("//" + request.headers.get("host", "")).hostname
    return (request.client is not None and request.client.host in LOOPBACK
            and host in (*LOOPBACK, "localhost"))


def authorize(request: Any) -> OperatorIdentity | None:
    """The console's hook: the operator the request names, if acme has one of that name."""
    if not _loopback(request):
        return None
    name = request.headers.get("x-operator") or request.cookies.get(COOKIE) or ""
    can_act = staff().get(name)
    if can_act is None:
        return None
    return OperatorIdentity(name, can_read=True, can_act=can_act)


def login(request: Request) -> Any:
    """``GET /ops-login?as=NAME``: the demo's browser login (loopback only), then ``/ops/``."""
    name = request.query_params.get("as", "")
    if not _loopback(request) or name not in staff():
        return PlainTextResponse(f"not one of acme's operators: {sorted(staff())}",
                                 status_code=403)
    response = RedirectResponse("/ops/", status_code=303)
    response.set_cookie(COOKIE, name, httponly=True, samesite="strict")
    return response
