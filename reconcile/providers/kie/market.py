"""KIE's market jobs API (kie-standard, kie-kling3, kie-lip-sync): ``/api/v1/jobs/createTask``
and ``recordInfo`` (``state``; ``resultJson``, a JSON string, holds the URLs or a text object)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from ...errors import MalformedResponse
from ..base import CreateRequest, Output, PollResult, unwrap_sdk
from ._common import (
    _URLS,
    Headers,
    KieApi,
    Progress,
    Text,
    Timestamp,
    _Model,
    _outputs,
    _read,
    state_decider,
)


class MarketRecord(_Model):
    task_id: Text = Field(None, alias="taskId")
    state: Text = None
    param: Any = None  # a JSON string holding the create body (and our callBackUrl)
    result_json: Any = Field(None, alias="resultJson")  # a JSON string to parse again
    fail_code: Text = Field(None, alias="failCode")
    fail_msg: Text = Field(None, alias="failMsg")
    progress: Progress = None  # third-party code reads it; not documented
    create_time: Timestamp = Field(None, alias="createTime")
    complete_time: Timestamp = Field(None, alias="completeTime")


_MARKET_RUNNING = {"waiting", "queuing", "queueing", "generating"}  # KIE spells it both ways


def _market_outputs(result_json: Any) -> tuple[Output, ...]:
    if isinstance(result_json, str):
        try:
            result_json = json.loads(result_json) if result_json.strip() else None
        except (ValueError, RecursionError):
            # A success whose result we cannot read must not pass as "no media" (that refunds).
            raise MalformedResponse("KIE market: resultJson is not JSON") from None
    result_json, _ = unwrap_sdk(result_json)
    if result_json is None:
        return ()
    if not isinstance(result_json, Mapping):
        raise MalformedResponse("KIE market: resultJson is not an object")
    outputs = _outputs(_URLS.validate_python(result_json.get("resultUrls")))
    obj = result_json.get("resultObject")
    if obj is not None:  # text models answer with an object instead of URLs
        text = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
        kind = "text/plain" if isinstance(obj, str) else "application/json"
        outputs += (Output(text=text, media_type=kind),)
    return outputs


_decide_market = state_decider(_MARKET_RUNNING, lambda r: _market_outputs(r.result_json))


def parse_record_market(body: Any, status_code: int = 200, headers: Headers = None) -> PollResult:
    """A ``/api/v1/jobs/recordInfo`` answer (``state``, ``resultJson`` string) → PollResult."""
    return _read(MarketRecord, _decide_market, body, status_code, headers)


def market_body(request: CreateRequest) -> dict[str, Any]:
    """Market: ``{"model", "input"}`` (+ ``callBackUrl``, added by the client)."""
    return {"model": request.model, "input": dict(request.input)}


MARKET = KieApi("kie-market", "/api/v1/jobs/createTask", "/api/v1/jobs/recordInfo",
                market_body, parse_record_market)
