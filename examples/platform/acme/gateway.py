"""acme's FastAPI gateway: ``uvicorn acme.gateway:app --host 127.0.0.1 --port 8000``.

The user is the ``X-User-Id`` header (a UUID) — a stand-in for acme's real authentication.
Each route is a thin call into :mod:`reconcile.api`, whose ``(status, body)`` is sent unchanged:

    POST /api/v1/jobs                  202 | 400 | 402 | 413 | 502 | 500 (the customer contract)
    GET  /api/v1/jobs/{id}             200 snapshot | 404
    POST /api/v1/jobs/{id}/cancel      200 snapshot | 404 | 409
    GET  /api/v1/jobs/{id}/events      Server-Sent Events from the outbox until the job is terminal
                                       | 429 TOO_MANY_STREAMS
    GET  /api/v1/credits               balance and ledger history
    POST /webhooks/{provider}          provider callbacks (signature-checked by the library) | 413
    GET  /ops/                         the library's operator console (acme.ops: a demo hook)

The library's calls are blocking: the short routes are plain ``def`` endpoints, or await the
call in a worker thread (``run_in_threadpool``: AnyIO's 40 worker threads), so the library's
enqueue happens in a worker thread — it goes through acme's app all the same. Nothing long may sit in that pool, or ``/healthz`` and every other user wait
(issue 25 findings 2 and 3):

* an event stream holds no thread: it is an async generator that awaits each short outbox read
  (:func:`reconcile.api.events_after`) in a small pool of its own and sleeps on the event loop;
  it ends when the client hangs up (noticed within one interval, and a keepalive comment every
  15 s finds a dead peer), and a user has at most ``STREAMS_PER_USER`` open (429
  ``TOO_MANY_STREAMS`` past it);
* a webhook's confirming read (a provider read, retried with ``Retry-After``) runs after the
  answer, in a small pool of its own: the delivery is verified and stored first, so it is
  never lost (``handle_webhook(defer=…)``);
* request bodies are read through the library's :class:`~reconcile.webhook_ingest.CappedBody`:
  a ``Content-Length`` over the cap is answered 413 before a byte is read, and a chunked body
  is cut at the cap + 1 byte.

The stream cap is per process: behind several uvicorn workers it is per worker.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from functools import cache
from typing import Annotated, Any

import anyio
from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from reconcile import api
from reconcile.console import create_app as operator_console
from reconcile.db.models import CreditBalance
from reconcile.errors import InvalidParam
from reconcile.webhook_ingest import BodyRefused, CappedBody, handle_webhook

from . import celery_app, ops  # noqa: F401 - celery_app installs the library into acme's app
from .catalog import allowed_model
from .runtime import build
from .settings import DEFAULT_PRICE, PRICES

app = FastAPI(title="acme gateway")
UserHeader = Annotated[str | None, Header()]
rt = build()
log = logging.getLogger("acme.gateway")

STREAMS_PER_USER = 5  # open event streams per user (429 TOO_MANY_STREAMS past it)
STREAM_INTERVAL = (0.5, 2.0)  # seconds between outbox reads: after an event, and at most
KEEPALIVE_SECONDS = 15.0  # an SSE comment this often: a write finds a peer that vanished
ENVELOPE_BYTES = 64 * 1024  # a submit body: the input (MAX_INPUT_BYTES) plus kind, model, type
_streams: Counter[uuid.UUID] = Counter()  # open streams per user (touched on the event loop only)


@cache
def _stream_reads() -> anyio.CapacityLimiter:
    """The threads the event streams' outbox reads may use at once (never the request pool's)."""
    return anyio.CapacityLimiter(8)


@cache
def _confirms() -> anyio.CapacityLimiter:
    """The threads webhook confirming reads may use at once, after their answer."""
    return anyio.CapacityLimiter(4)


def _answer(result: api.Response) -> JSONResponse:
    status, body = result
    return JSONResponse(body, status_code=status)


def _user(x_user_id: str | None) -> uuid.UUID:
    try:
        return uuid.UUID(str(x_user_id))
    except ValueError:
        raise InvalidParam("X-User-Id must be a user id (UUID)", param="X-User-Id") from None


async def _body(request: Request, limit: int, *, code: str, what: str) -> bytes:
    """The request body read through the library's cap (raises BodyRefused: 413 / 400)."""
    capped = CappedBody(limit, request.headers, code=code, what=what)
    async for chunk in request.stream():
        capped.feed(chunk)
    return capped.body()


@app.exception_handler(InvalidParam)
def _invalid(_: Request, exc: InvalidParam) -> JSONResponse:
    return _answer(api.error_response(exc))


@app.exception_handler(BodyRefused)
def _refused(_: Request, exc: BodyRefused) -> JSONResponse:
    return _answer(exc.response)


@app.exception_handler(RequestValidationError)
def _unparseable(_: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    return _answer(api.error_response(InvalidParam(str(first.get("msg", "invalid request")),
                                                   param=param)))


@app.post("/api/v1/jobs")
async def submit_job(request: Request, x_user_id: UserHeader = None,
                     idempotency_key: Annotated[str | None, Header()] = None) -> JSONResponse:
    """Price the job (acme's table), then reserve + insert + run the create (inline). A client's
    ``Idempotency-Key`` header makes a retried POST return the original job (24 h). The body is
    read under the cap here; parsing it and the library's call run in a worker thread."""
    user = _user(x_user_id)
    raw = await _body(request, rt.settings.max_input_bytes + ENVELOPE_BYTES,
                      code="INVALID_PARAM", what="request body")
    return _answer(await run_in_threadpool(_submit, user, raw, idempotency_key))


def _submit(user: uuid.UUID, raw: bytes, idempotency_key: str | None) -> api.Response:
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError):
        return api.error_response(InvalidParam("the body is not JSON", param="body"))
    if not isinstance(payload, dict):
        return api.error_response(InvalidParam("the body must be a JSON object", param="body"))
    kind = payload.get("provider_kind")
    if not isinstance(kind, str) or not isinstance(payload.get("model"), str):
        return api.error_response(InvalidParam("provider_kind and model are required strings",
                                               param="provider_kind"))
    return api.submit(rt, user, kind, payload["model"], payload.get("input") or {},
                      PRICES.get(kind, DEFAULT_PRICE), job_type=str(payload.get("job_type") or "image"),
                      inline=True, idempotency_key=idempotency_key,
                      validator=allowed_model)


@app.get("/api/v1/jobs/{job_id}")
def get_job(job_id: str, x_user_id: UserHeader = None) -> JSONResponse:
    return _answer(api.snapshot(rt, _user(x_user_id), job_id))


@app.post("/api/v1/jobs/{job_id}/cancel")
def cancel_job(job_id: str, x_user_id: UserHeader = None) -> JSONResponse:
    return _answer(api.cancel(rt, _user(x_user_id), job_id))


class _Stream(StreamingResponse):
    """An SSE response that gives its user's stream slot back however it ends (finished, client
    gone, cancelled, or never started)."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


@app.get("/api/v1/jobs/{job_id}/events", response_model=None)
async def job_events(job_id: str, request: Request, x_user_id: UserHeader = None) -> Any:
    """The job's outbox events as SSE (``id``/``event``/``data``) until it is terminal."""
    user = _user(x_user_id)
    if _streams[user] >= STREAMS_PER_USER:
        return JSONResponse({"error": {
            "type": "rate_limit_error", "code": "TOO_MANY_STREAMS",
            "message": f"at most {STREAMS_PER_USER} open event streams per user"}}, status_code=429)
    _streams[user] += 1  # taken before the first await: the check and the take are one step
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            _streams[user] -= 1
            if _streams[user] <= 0:
                del _streams[user]

    try:
        status, body = await run_in_threadpool(api.snapshot, rt, user, job_id)
    except BaseException:
        release()
        raise
    if status != 200:
        release()
        return JSONResponse(body, status_code=status)

    async def stream() -> AsyncIterator[str]:
        cursor, interval, quiet = 0, STREAM_INTERVAL[0], 0.0
        while not await request.is_disconnected():
            frames, cursor, over = await anyio.to_thread.run_sync(
                api.events_after, rt, user, job_id, cursor, limiter=_stream_reads())
            for frame in frames:
                yield f"id: {frame['id']}\nevent: {frame['event']}\ndata: {frame['data']}\n\n"
            if over:
                return
            if frames:
                interval, quiet = STREAM_INTERVAL[0], 0.0
            elif quiet >= KEEPALIVE_SECONDS:
                yield ": keepalive\n\n"
                quiet = 0.0
            await anyio.sleep(interval)  # on the event loop: no thread is held while waiting
            quiet += interval
            interval = min(interval * 1.5, STREAM_INTERVAL[1])

    return _Stream(stream(), release)


@app.get("/api/v1/credits")
def get_credits(x_user_id: UserHeader = None) -> JSONResponse:
    user = _user(x_user_id)
    status, body = api.credit_history(rt, user)
    if status == 200:
        with rt.sessions() as session:
            balance = session.get(CreditBalance, user)
        body = {"balance": {"sub": balance.sub if balance else 0,
                            "topup": balance.topup if balance else 0}, **body}
    return JSONResponse(body, status_code=status)


@app.post("/webhooks/{provider}")
async def webhook(provider: str, request: Request) -> JSONResponse:
    raw = await _body(request, rt.settings.webhook_max_body_bytes, code="WEBHOOK_INVALID",
                      what="webhook body")
    deferred: list[Callable[[], api.Response]] = []
    status, body = await run_in_threadpool(
        lambda: handle_webhook(rt, provider, dict(request.headers), raw,
                               dict(request.query_params), defer=deferred.append))
    # the delivery is stored: its confirming read runs after the answer, never in the request pool
    return JSONResponse(body, status_code=status,
                        background=BackgroundTask(_confirm_after, deferred) if deferred else None)


async def _confirm_after(deferred: list[Callable[[], api.Response]]) -> None:
    for confirm in deferred:
        try:
            await anyio.to_thread.run_sync(confirm, limiter=_confirms())
        except Exception:  # the delivery is stored and the job still polled: log and go on
            log.exception("webhook_confirm_failed")


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


# the operator console: the library's pages and actions, behind acme's (demo) authorization hook
app.mount("/ops", operator_console(rt, authorize=ops.authorize))
app.add_api_route("/ops-login", ops.login, methods=["GET"], include_in_schema=False)
