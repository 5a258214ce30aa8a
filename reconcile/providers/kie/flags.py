"""KIE's ``successFlag`` APIs: Veo, Flux Kontext and Luma modify share one record shape
(``successFlag`` 0 running / 1 done / 2–3 failed; Luma's 4: the callback failed, the generation
succeeded) with ``response.resultUrls`` or ``response.resultImageUrl``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field

from ..base import CreateRequest, PollResult, PollStatus
from ._common import Headers, KieApi, Text, Timestamp, Urls, _Model, _outputs, _read, top_level_body


class FlagResponse(_Model):
    result_urls: Urls = Field((), alias="resultUrls")  # Veo, Luma
    result_image_url: Urls = Field((), alias="resultImageUrl")  # Flux Kontext: one image


class FlagRecord(_Model):
    """Veo, Flux Kontext and Luma share ``successFlag`` + ``response`` + ``errorCode``."""

    task_id: Text = Field(None, alias="taskId")
    param: Any = Field(None, alias="paramJson")
    success_flag: Text = Field(None, alias="successFlag")
    response: Any = None  # read only on success: a running task's odd shape must not fail
    error_code: Text = Field(None, alias="errorCode")
    error_message: Text = Field(None, alias="errorMessage")
    create_time: Timestamp = Field(None, alias="createTime")
    complete_time: Timestamp = Field(None, alias="completeTime")


def _flag_decider(succeeded: frozenset[str]) -> Callable[[FlagRecord], PollResult]:
    def decide(r: FlagRecord) -> PollResult:
        flag = (r.success_flag or "").strip()
        if flag == "0":
            return PollResult(PollStatus.RUNNING, raw_status=flag)
        if flag in succeeded:
            resp = FlagResponse.model_validate(r.response or {})
            return PollResult(PollStatus.SUCCEEDED, progress=100, raw_status=flag,
                              outputs=_outputs(resp.result_urls + resp.result_image_url))
        if flag in ("2", "3"):
            return PollResult(PollStatus.FAILED, raw_status=flag, error_code=r.error_code,
                              error_message=r.error_message)
        return PollResult(PollStatus.UNKNOWN, raw_status=r.success_flag)

    return decide


_decide_flag = _flag_decider(frozenset({"1"}))  # Veo and Flux Kontext
_decide_luma = _flag_decider(frozenset({"1", "4"}))  # 4: callback failed, generation succeeded


def parse_record_veo(body: Any, status_code: int = 200, headers: Headers = None) -> PollResult:
    """A Veo record (successFlag 0/1/2/3, ``response.resultUrls``) → PollResult."""
    return _read(FlagRecord, _decide_flag, body, status_code, headers)


def parse_record_kontext(body: Any, status_code: int = 200, headers: Headers = None) -> PollResult:
    """A Flux Kontext record (successFlag 0/1/2/3, ``response.resultImageUrl``) → PollResult."""
    return _read(FlagRecord, _decide_flag, body, status_code, headers)


def parse_record_luma(body: Any, status_code: int = 200, headers: Headers = None) -> PollResult:
    """A Luma modify record (successFlag 0–4; 4 is still a success) → PollResult."""
    return _read(FlagRecord, _decide_luma, body, status_code, headers)


def modelless_body(request: CreateRequest) -> dict[str, Any]:
    """Luma modify has no ``model`` parameter: the input's fields only."""
    return dict(request.input)


VEO = KieApi("kie-veo", "/api/v1/veo/generate", "/api/v1/veo/record-info",
             top_level_body, parse_record_veo)
KONTEXT = KieApi("kie-kontext", "/api/v1/flux/kontext/generate",
                 "/api/v1/flux/kontext/record-info", top_level_body, parse_record_kontext)
LUMA = KieApi("kie-luma", "/api/v1/modify/generate", "/api/v1/modify/record-info",
              modelless_body, parse_record_luma)
