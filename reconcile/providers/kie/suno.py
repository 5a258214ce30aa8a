"""KIE's Suno API: ``/api/v1/generate`` and its ``record-info`` (``status``; every
``sunoData[].audioUrl`` on SUCCESS)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError

from ..base import PollResult, PollStatus
from ._common import Headers, KieApi, Text, Urls, _Model, _outputs, _read, top_level_body


class SunoTrack(_Model):
    audio_url: Urls = Field((), alias="audioUrl")


class SunoResponse(_Model):
    suno_data: list[SunoTrack] | None = Field(None, alias="sunoData")


class SunoRecord(_Model):
    task_id: Text = Field(None, alias="taskId")
    param: Any = None
    status: Text = None
    response: Any = None  # read only on SUCCESS
    error_code: Text = Field(None, alias="errorCode")
    error_message: Text = Field(None, alias="errorMessage")


_SUNO_RUNNING = {"PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS"}
_SUNO_FAILED = {"CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED", "CALLBACK_EXCEPTION",
                "SENSITIVE_WORD_ERROR"}


def _suno_urls(r: SunoRecord) -> tuple[str, ...]:
    tracks = SunoResponse.model_validate(r.response or {}).suno_data or []
    return tuple(url for track in tracks for url in track.audio_url)


def _decide_suno(r: SunoRecord) -> PollResult:
    status = (r.status or "").upper()
    if status in _SUNO_RUNNING:
        return PollResult(PollStatus.RUNNING, raw_status=r.status)
    if status == "SUCCESS":
        return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status=r.status,
                          outputs=_outputs(_suno_urls(r)))
    if status == "CALLBACK_EXCEPTION":
        # DECISION: docs.kie.ai/suno-api/get-music-details says only "Error during callback
        # process" — the delivery to our callBackUrl failed, not the generation (the same as
        # Luma's successFlag 4, "generation succeeded but callback failed"). With tracks in the
        # record the music exists and was billed: a success. Without tracks nothing was made.
        try:
            urls = _suno_urls(r)
        except ValidationError:
            urls = ()
        if urls:
            return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status=r.status,
                              outputs=_outputs(urls))
    if status in _SUNO_FAILED:
        return PollResult(PollStatus.FAILED, raw_status=r.status, error_code=r.error_code,
                          error_message=r.error_message)
    return PollResult(PollStatus.UNKNOWN, raw_status=r.status)


def parse_record_suno(body: Any, status_code: int = 200, headers: Headers = None) -> PollResult:
    """A Suno record (``status``; every ``sunoData[].audioUrl`` on SUCCESS) → PollResult."""
    return _read(SunoRecord, _decide_suno, body, status_code, headers)


SUNO = KieApi("kie-suno", "/api/v1/generate", "/api/v1/generate/record-info",
              top_level_body, parse_record_suno)
