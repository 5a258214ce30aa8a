"""Internal: the library's own mechanics, not an import path for platforms (may move).

Anthropic's Messages API as the simulator serves it under ``/anthropic``.

Synchronous: one ``POST /v1/messages`` answers a message object, or with ``"stream": true`` the
same message as server-sent events (``message_start`` … ``message_stop``, the sequence of
docs.anthropic.com's streaming page). Every answer, errors included, carries a ``request-id``
header (``req_…``), and errors use the ``{"type": "error", "error": {...}, "request_id": ...}``
body. The key is accepted as ``x-api-key`` or as ``Authorization: Bearer`` (what the
``anthropic`` SDK 2.x sends for an ``api_key``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .sim_core import Request, Response, Script, json_response, retry_after_header
from .sim_registry import SimRoute, register_route

if TYPE_CHECKING:
    from .simulator import Simulator

PREFIX = "anthropic"
PROVIDER = "anthropic"

_ERRORS = {
    "auth": (401, "authentication_error", "invalid x-api-key"),
    "invalid": (400, "invalid_request_error", "messages: field required"),
    "rate_limit": (429, "rate_limit_error", "Number of requests has exceeded your rate limit"),
    "server_error": (500, "api_error", "Internal server error (simulated)"),
    "kie_200_error": (500, "api_error", "Internal server error (simulated)"),
    "not_found": (404, "not_found_error", "Not found"),
    "version": (400, "invalid_request_error", "anthropic-version: header is required"),
}


def authorized(req: Request) -> bool:
    scheme, _, token = req.header("authorization").partition(" ")
    return bool(req.header("x-api-key").strip()) or (scheme.lower() == "bearer" and bool(token.strip()))


def error(kind: str, script: Script, code: int | None = None, request_id: str = "req_sim") -> Response:
    status, error_type, message = _ERRORS[kind]
    headers = {"request-id": request_id}
    if kind == "rate_limit":
        headers.update({k.lower(): v for k, v in retry_after_header(script).items()})
    return json_response(status, {"type": "error", "request_id": request_id,
                                  "error": {"type": error_type, "message": message}}, headers)


def handle(sim: Simulator, req: Request) -> Response | None:
    if req.method != "POST" or req.path != "/v1/messages":
        return None
    request_id = "req_" + sim.new_id(24)
    script = sim.script_for(None, None)
    if not req.header("anthropic-version"):
        return error("version", script, request_id=request_id)
    body = req.json()
    if not isinstance(body, dict) or not body.get("messages") or not body.get("max_tokens"):
        return error("invalid", script, request_id=request_id)
    model = str(body.get("model") or "claude-sonnet-4-5")
    rejected = sim.call(PROVIDER, model)
    if rejected is not None:
        return error(rejected.kind, rejected.script, rejected.code, request_id=request_id)
    message: dict[str, Any] = {
        "id": "msg_" + sim.new_id(24), "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": "Simulated reply."}],
        "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 3, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0},
    }
    if body.get("stream") is True:
        return _stream(message, request_id)
    return json_response(200, message, {"request-id": request_id})


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _stream(message: dict[str, Any], request_id: str) -> Response:
    """The message as Anthropic streams it: start, one text block in deltas, stop."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None,
             "usage": {**usage, "output_tokens": 1}}
    events = [_event("message_start", {"type": "message_start", "message": start}),
              _event("content_block_start", {"type": "content_block_start", "index": 0,
                                             "content_block": {"type": "text", "text": ""}}),
              _event("ping", {"type": "ping"})]
    for piece in ("Simulated", " reply."):
        events.append(_event("content_block_delta", {
            "type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": piece}}))
    events += [_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
               _event("message_delta", {"type": "message_delta",
                                        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                        "usage": {"output_tokens": usage["output_tokens"]}}),
               _event("message_stop", {"type": "message_stop"})]
    return Response(200, b"".join(events), {"Content-Type": "text/event-stream; charset=utf-8",
                                            "Cache-Control": "no-cache", "request-id": request_id})


register_route(SimRoute(
    PREFIX, authorized, error, handle, url_settings={"anthropic_base_url": ""},
    api_key_settings=("anthropic_api_key",),
    examples={"anthropic-sync": ("claude-sonnet",
                                 {"messages": [{"role": "user", "content": "hi"}]})},
    chaos={"anthropic-sync": 1}))
