"""KIE's Runway API: ``/api/v1/runway/generate`` and ``record-detail`` (``state``;
``videoInfo.videoUrl``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ..base import PollResult
from ._common import (
    Headers,
    KieApi,
    Text,
    Timestamp,
    Urls,
    _Model,
    _outputs,
    _read,
    state_decider,
    top_level_body,
)


class RunwayVideo(_Model):
    video_url: Urls = Field((), alias="videoUrl")


class RunwayRecord(_Model):
    task_id: Text = Field(None, alias="taskId")
    param: Any = Field(None, alias="generateParam")
    state: Text = None
    video_info: Any = Field(None, alias="videoInfo")  # read only on success
    fail_code: Text = Field(None, alias="failCode")
    fail_msg: Text = Field(None, alias="failMsg")
    generate_time: Timestamp = Field(None, alias="generateTime")


_RUNWAY_RUNNING = {"wait", "waiting", "queueing", "queuing", "generating"}


_decide_runway = state_decider(
    _RUNWAY_RUNNING, lambda r: _outputs(RunwayVideo.model_validate(r.video_info or {}).video_url))


def parse_record_runway(body: Any, status_code: int = 200, headers: Headers = None) -> PollResult:
    """A Runway ``record-detail`` answer (``state``; ``videoInfo.videoUrl``) → PollResult."""
    return _read(RunwayRecord, _decide_runway, body, status_code, headers)


# DECISION (Runway, Veo): both accept ``callBackUrl`` (KIE's callback pages; the OpenAPI callback
# ``{$request.body#/callBackUrl}`` of /api/v1/runway/generate), so the client sends it, but their
# documented records (``generateParam`` / ``paramJson``) do not echo it: planted_job_id may be
# None, and an uncertain create of these kinds waits for an operator (README, Provider notes).
RUNWAY = KieApi("kie-runway", "/api/v1/runway/generate", "/api/v1/runway/record-detail",
                top_level_body, parse_record_runway)


