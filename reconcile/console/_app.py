"""Internal: the console's ASGI app — routes, the authorization guard, CSRF, the security
headers, the templates (Jinja2, autoescaped; every value shown through :func:`_shown`, which
makes control and bidi characters visible), and the action forms' POST, which calls
:func:`reconcile.operator.run` and nothing else."""

from __future__ import annotations

import inspect
import json
import logging
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from jinja2 import Environment, PackageLoader
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from .. import operator
from ..core import redact
from ..runtime import Runtime
from . import _pages, _story
from ._auth import (
    CSRF_COOKIE,
    CSRF_FIELD,
    DEV_COOKIE,
    NOT_CONFIGURED,
    Csrf,
    DevLogin,
    OperatorIdentity as Identity,
)

log = logging.getLogger("reconcile.console")

FORM_LIMIT = 64 * 1024
CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
           "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin",
           "Cache-Control": "no-store"}
STATIC = Path(__file__).resolve().parent / "static"
SERVER_ERROR = ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Error · "
                "reconcile</title></head><body><h1>Something went wrong</h1><p id=\"outcome\" "
                "data-outcome=\"error\">The console failed to answer this request; the server's "
                "log has the detail. After an action, reload the job's story to see its state."
                "</p></body></html>")


def _span(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d"] * bool(days) + [f"{hours}h"] * bool(hours) + [f"{minutes}m"] * bool(
        minutes) + [f"{secs}s"] * (not (days or hours) or bool(secs))
    return sign + " ".join(parts[:2])


def _shown(value: Any) -> Any:
    """Every ``{{ value }}`` of a template: dates and spans readable, structures as redacted
    JSON, and each non-printable character (ESC, bidi overrides…) as its visible escape;
    autoescaping then makes it HTML."""
    if isinstance(value, Markup):
        return value
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, timedelta):
        return _span(value)
    if isinstance(value, dict | list):
        return json.dumps(redact.value(value), ensure_ascii=True, default=str, sort_keys=True)
    return redact.for_terminal(str(value))


def _env() -> Environment:
    env = Environment(loader=PackageLoader("reconcile.console", "templates"), autoescape=True,
                      finalize=_shown, trim_blocks=True, lstrip_blocks=True)
    # indented JSON for a <pre>: ensure_ascii leaves no control or bidi character but the
    # indentation's newlines; escaped here, so the finalize step passes it through
    env.filters["pretty"] = lambda v: escape(json.dumps(redact.value(v), indent=1,
                                                        ensure_ascii=True, default=str,
                                                        sort_keys=True))
    env.filters["label"] = lambda v: str(v).replace("_", " ")
    return env


class Console:
    """One mounted console: its runtime (built on first use when not given), the hook, CSRF."""

    def __init__(self, rt: Runtime | None, runtime_factory: Callable[[], Runtime] | None,
                 authorize: Callable[[Request], Any] | None, secret: bytes | str | None,
                 dev: DevLogin | None) -> None:
        self._rt, self._factory, self._lock = rt, runtime_factory, threading.Lock()
        self.authorize = dev if dev is not None else authorize
        self.dev = dev
        self.csrf = Csrf(secret)
        self.env = _env()

    def runtime(self) -> Runtime:
        with self._lock:
            if self._rt is None:
                if self._factory is None:
                    raise RuntimeError("the console was created without a runtime")
                self._rt = self._factory()
            return self._rt

    # ------------------------------------------------------------------------- plumbing

    def page(self, request: Request, template: str, status: int = 200,
             who: Identity | None = None, **ctx: Any) -> Response:
        cookie = request.cookies.get(CSRF_COOKIE)
        fresh = cookie is None
        cookie = cookie or self.csrf.new_cookie()
        base = request.scope.get("root_path", "").rstrip("/")
        html = self.env.get_template(template).render(
            base=base, who=who, csrf=self.csrf.token(cookie, who.name) if who else "",
            csrf_field=CSRF_FIELD, **ctx)
        response = HTMLResponse(html, status_code=status, headers=HEADERS)
        if fresh:
            response.set_cookie(CSRF_COOKIE, cookie, httponly=True, samesite="strict",
                                secure=request.url.scheme == "https", path=base or "/")
        return response

    def refuse(self, request: Request, status: int, title: str, message: str,
               who: Identity | None = None) -> Response:
        return self.page(request, "message.html", status, who, title=title, message=message,
                         outcome="forbidden" if status == 403 else "error")

    async def identify(self, request: Request) -> Identity | Response:
        """The operator the hook vouches for, or the 403 page to answer instead."""
        if self.authorize is None:
            return self.page(request, "message.html", 403, title="Not configured",
                             message=NOT_CONFIGURED, outcome="not-configured")
        try:
            hook = self.authorize
            if inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(
                    getattr(hook, "__call__", None)):  # noqa: B004
                who = await hook(request)  # type: ignore[misc]  # the check above
            else:
                who = await run_in_threadpool(hook, request)
                if inspect.isawaitable(who):
                    who = await who
        except Exception:
            log.exception("console_authorize_failed path=%s", request.url.path)
            who = None
        if not isinstance(who, Identity) or not who.can_read:
            hint = " Open the URL `reconcile console --dev` printed." if self.dev else ""
            return self.refuse(request, 403, "Not authorized",
                               "The platform's authorization hook does not let this request "
                               f"read the operator console.{hint}")
        return who

    async def _read(self, request: Request, template: str, build: Callable[..., Any],
                    *args: Any) -> Response:
        who = await self.identify(request)
        if isinstance(who, Response):
            return who
        try:
            ctx = await run_in_threadpool(build, *args)
        except _pages.BadRequest as exc:
            return self.refuse(request, 400, "Bad request", str(exc), who)
        if ctx is None:
            return self.refuse(request, 404, "Not found", "Nothing names this id.", who)
        return self.page(request, template, 200, who, **ctx)

    # ------------------------------------------------------------------------- pages

    async def attention(self, request: Request) -> Response:
        return await self._read(request, "attention.html",
                                lambda: _pages.attention(self.runtime(), request.query_params))

    async def one_list(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _pages.TITLES:
            who = await self.identify(request)
            return who if isinstance(who, Response) else self.refuse(
                request, 404, "Not found", "No such list.", who)

        def build() -> dict[str, Any]:
            _, _, echo = _pages.filters(request.query_params)
            page = _pages.one_list(self.runtime(), name, request.query_params, _pages.PAGE)
            return {"name": name, "title": _pages.TITLES[name], "page": page,
                    "columns": _pages.COLUMNS[name], "filters": echo, "kinds": _pages.kinds()}

        return await self._read(request, "list.html", build)

    async def job(self, request: Request) -> Response:
        job_id = _uuid(request.path_params["job_id"])
        if job_id is None:
            return await self._read(request, "story.html", lambda: None)
        who = await self.identify(request)
        if isinstance(who, Response):
            return who
        act = who.can_act

        def build() -> dict[str, Any] | None:
            rt = self.runtime()
            with rt.sessions() as session:
                found = _story.story(rt, session, job_id, rt.now())
            if found is None:
                return None
            found["allowed"] = operator.allowed(rt, job_id) if act else []
            found["resolves"] = operator.RESOLVES
            found["labels"] = {name: a.label for name, a in operator.REGISTRY.items()}
            return found

        try:
            ctx = await run_in_threadpool(build)
        except _pages.BadRequest as exc:
            return self.refuse(request, 400, "Bad request", str(exc), who)
        if ctx is None:
            return self.refuse(request, 404, "Not found", f"Nothing names job {job_id}.", who)
        return self.page(request, "story.html", 200, who, **ctx)

    async def user(self, request: Request) -> Response:
        user_id = _uuid(request.path_params["user_id"])
        if user_id is None:
            return await self._read(request, "user.html", lambda: None)
        return await self._read(request, "user.html", lambda: _pages.user(self.runtime(), user_id))

    async def audit(self, request: Request) -> Response:
        return await self._read(request, "audit.html",
                                lambda: _pages.audit(self.runtime(), request.query_params))

    async def health(self, request: Request) -> Response:
        return await self._read(request, "health.html", lambda: _pages.health(self.runtime()))

    async def css(self, request: Request) -> Response:
        who = await self.identify(request)
        if isinstance(who, Response):
            return who
        return Response((STATIC / "console.css").read_bytes(), media_type="text/css",
                        headers={**HEADERS, "Cache-Control": "max-age=300"})

    async def login(self, request: Request) -> Response:
        """``--dev`` only: the one-time token for a session cookie."""
        if self.dev is None:
            who = await self.identify(request)
            return who if isinstance(who, Response) else self.refuse(
                request, 404, "Not found", "No such page.", who)
        session = self.dev.exchange(request.query_params.get("token"))
        if session is None:
            return self.refuse(request, 403, "Not authorized",
                               "This one-time token is wrong or was used already: restart "
                               "`reconcile console --dev` for a new one.")
        base = request.scope.get("root_path", "").rstrip("/")
        response = RedirectResponse(f"{base}/", status_code=303, headers=HEADERS)
        response.set_cookie(DEV_COOKIE, session, httponly=True, samesite="strict",
                            path=base or "/")
        return response

    # ------------------------------------------------------------------------- actions

    async def act(self, request: Request) -> Response:
        """A form's POST: the operator may act, the CSRF token matches, then
        :func:`reconcile.operator.run` — the one implementation of every action."""
        who = await self.identify(request)
        if isinstance(who, Response):
            return who
        if not who.can_act:
            return self.refuse(request, 403, "Not allowed",
                               f"{who.name} may read the console but not act on jobs; nothing "
                               "was changed.", who)
        origin = request.headers.get("origin")
        if origin and origin != "null" and origin.split("://", 1)[-1] != request.headers.get(
                "host", ""):
            return self.refuse(request, 403, "Refused", "A form from another site; nothing "
                               "was changed.", who)
        form = await _form(request)
        if form is None or not self.csrf.valid(request.cookies.get(CSRF_COOKIE), who.name,
                                                form.get(CSRF_FIELD)):
            return self.refuse(request, 403, "Refused", "The form's CSRF token is missing or "
                               "does not match: reload the page and try again. Nothing was "
                               "changed.", who)
        job_id = _uuid(request.path_params["job_id"])
        action = request.path_params["action"]
        if job_id is None or action not in operator.ACTIONS:
            return self.refuse(request, 404, "Not found", "No such job or action.", who)
        upstream = form.get("upstream_id") if action == operator.RESOLVE_UPSTREAM else None

        def run() -> tuple[str, str]:
            try:
                done = operator.run(self.runtime(), action, job_id,
                                    operator=operator.Operator(who.name, via="console"),
                                    reason=form.get("reason"), upstream_id=upstream)
            except operator.ActionRefused as exc:
                return "refused", str(exc)
            except operator.ActionLost as exc:
                return "lost", str(exc)
            return ("done" if done.changed else "nothing"), done.message

        outcome, message = await run_in_threadpool(run)
        status = 200 if outcome in ("done", "nothing") else 409
        return self.page(request, "message.html", status, who, outcome=outcome,
                         title={"done": "Done", "nothing": "Nothing to do",
                                "refused": "Refused", "lost": "Not done"}[outcome],
                         message=message, job_id=job_id, action=action)


def _uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


async def _form(request: Request) -> dict[str, str] | None:
    """An ``application/x-www-form-urlencoded`` body (at most :data:`FORM_LIMIT` bytes); None
    for anything else."""
    if request.headers.get("content-type", "").split(";")[0].strip() != \
            "application/x-www-form-urlencoded":
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_LIMIT:
            return None
    try:
        return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True,
                              max_num_fields=20))
    except (UnicodeDecodeError, ValueError):
        return None


def build_app(console: Console) -> Starlette:
    c = console
    routes = [
        Route("/", c.attention, methods=["GET"]),
        Route("/lists/{name}", c.one_list, methods=["GET"]),
        Route("/jobs/{job_id}", c.job, methods=["GET"]),
        Route("/jobs/{job_id}/{action}", c.act, methods=["POST"]),
        Route("/users/{user_id}", c.user, methods=["GET"]),
        Route("/audit", c.audit, methods=["GET"]),
        Route("/health", c.health, methods=["GET"]),
        Route("/static/console.css", c.css, methods=["GET"]),
        Route("/login", c.login, methods=["GET"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        who = await c.identify(request)
        if isinstance(who, Response):
            return who
        return c.refuse(request, 404 if getattr(exc, "status_code", 404) == 404 else 405,
                        "Not found", "No such page.", who)

    async def server_error(request: Request, exc: Exception) -> Response:
        # the server logs the exception; the browser gets no detail of it, and the headers
        return HTMLResponse(SERVER_ERROR, status_code=500, headers=HEADERS)

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found,
                                                       Exception: server_error})
    # no redirect of "/audit/" to "/audit": the router answers it before the hook runs (a 307
    # to a URL built from the Host header, without the security headers); a 404 goes through
    # the hook like every other answer
    app.router.redirect_slashes = False
    app.state.console = console
    return app
