"""acme's FastAPI gateway: ``uvicorn acme.gateway:app --host 127.0.0.1 --port 8000``.

The user is the ``X-User-Id`` header (a UUID) — a stand-in for acme's real authentication.
Each route is a thin call into :mod:`reconcile.api`, whose ``(status, body)`` is sent unchanged:

    POST /api/v1/jobs                  202 | 400 | 402 | 502 | 500 (the library's customer contract)
    GET  /api/v1/jobs/{id}             200 snapshot | 404
    POST /api/v1/jobs/{id}/cancel      200 snapshot | 404 | 409
    GET  /api/v1/jobs/{id}/events      Server-Sent Events from the outbox until the job is terminal
    GET  /api/v1/credits               balance and ledger history
    POST /webhooks/{provider}          provider callbacks (signature-checked by the library)

The job routes are plain ``def`` endpoints: FastAPI runs them in its thread pool, so the
library's enqueue happens in a worker thread — it goes through acme's app all the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Body, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from reconcile import api
from reconcile.db.models import CreditBalance
from reconcile.errors import InvalidParam
from reconcile.webhook_ingest import handle_webhook

from . import celery_app  # noqa: F401 - installs the library into acme's Celery app
from .catalog import allowed_model
from .runtime import build
from .settings import DEFAULT_PRICE, PRICES

app = FastAPI(title="acme gateway")
UserHeader = Annotated[str | None, Header()]
rt = build()


def _answer(result: api.Response) -> JSONResponse:
    status, body = result
    return JSONResponse(body, status_code=status)


def _user(x_user_id: str | None) -> uuid.UUID:
    try:
        return uuid.UUID(str(x_user_id))
    except ValueError:
        raise InvalidParam("X-User-Id must be a user id (UUID)", param="X-User-Id") from None


@app.exception_handler(InvalidParam)
def _invalid(_: Request, exc: InvalidParam) -> JSONResponse:
    return _answer(api.error_response(exc))


@app.exception_handler(RequestValidationError)
def _unparseable(_: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    return _answer(api.error_response(InvalidParam(str(first.get("msg", "invalid request")),
                                                   param=param)))


@app.post("/api/v1/jobs")
def submit_job(payload: Annotated[dict[str, Any], Body()],
               x_user_id: UserHeader = None,
               idempotency_key: Annotated[str | None, Header()] = None) -> JSONResponse:
    """Price the job (acme's table), then reserve + insert + run the create (inline). A client's
    ``Idempotency-Key`` header makes a retried POST return the original job (24 h)."""
    user = _user(x_user_id)
    kind = payload.get("provider_kind")
    if not isinstance(kind, str) or not isinstance(payload.get("model"), str):
        raise InvalidParam("provider_kind and model are required strings", param="provider_kind")
    return _answer(api.submit(
        rt, user, kind, payload["model"], payload.get("input") or {},
        PRICES.get(kind, DEFAULT_PRICE), job_type=str(payload.get("job_type") or "image"),
        inline=True, idempotency_key=idempotency_key, validator=allowed_model))


@app.get("/api/v1/jobs/{job_id}")
def get_job(job_id: str, x_user_id: UserHeader = None) -> JSONResponse:
    return _answer(api.snapshot(rt, _user(x_user_id), job_id))


@app.post("/api/v1/jobs/{job_id}/cancel")
def cancel_job(job_id: str, x_user_id: UserHeader = None) -> JSONResponse:
    return _answer(api.cancel(rt, _user(x_user_id), job_id))


@app.get("/api/v1/jobs/{job_id}/events", response_model=None)
def job_events(job_id: str, x_user_id: UserHeader = None) -> Any:
    """The job's outbox events as SSE (``id``/``event``/``data``) until it is terminal."""
    user = _user(x_user_id)
    status, body = api.snapshot(rt, user, job_id)
    if status != 200:
        return JSONResponse(body, status_code=status)

    def stream() -> Iterator[str]:  # a sync generator: Starlette iterates it in a thread
        for event in api.follow(rt, user, job_id, interval=0.5):
            yield f"id: {event['id']}\nevent: {event['event']}\ndata: {event['data']}\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


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
    raw = await request.body()
    result = await run_in_threadpool(handle_webhook, rt, provider, dict(request.headers), raw,
                                     dict(request.query_params))
    return _answer(result)


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}
