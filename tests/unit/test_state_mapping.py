"""Each provider's state mapping, table-driven and database-free: the provider's own raw status
token (as its status read answers it) → the library's :class:`PollStatus`.

One row per documented token of every family, plus an unknown token (never guessed: UNKNOWN) and
the not-found answer. The bodies are the smallest the parsers accept; the fidelity tests check
the full documented shapes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from reconcile.providers import PollResult, PollStatus, elevenlabs, fal, kie, replicate

R, S, F, C, U, N = (PollStatus.RUNNING, PollStatus.SUCCEEDED, PollStatus.FAILED,
                    PollStatus.CANCELED, PollStatus.UNKNOWN, PollStatus.NOT_FOUND)
URL = "https://cdn.example/out.png"


def _kie(record: dict[str, Any]) -> bytes:
    return json.dumps({"code": 200, "msg": "success", "data": {"taskId": "t1", **record}}).encode()


def market(state: str) -> PollResult:
    return kie.parse_record_market(_kie({"state": state,
                                         "resultJson": json.dumps({"resultUrls": [URL]})}))


def flag(parse: Callable[..., PollResult]) -> Callable[[str], PollResult]:
    def read(value: str) -> PollResult:
        return parse(_kie({"successFlag": int(value), "response": {"resultUrls": [URL],
                                                                  "resultImageUrl": URL}}))
    return read


def suno(status: str, tracks: bool = True) -> PollResult:
    response = {"sunoData": [{"audioUrl": URL}]} if tracks else {"sunoData": []}
    return kie.parse_record_suno(_kie({"status": status, "response": response}))


def runway(state: str) -> PollResult:
    return kie.parse_record_runway(_kie({"state": state, "videoInfo": {"videoUrl": URL}}))


def predict(status: str) -> PollResult:
    return replicate.parse_status(200, json.dumps({"id": "p1", "status": status,
                                                   "output": [URL]}).encode())


def dubbing(status: str) -> PollResult:
    return elevenlabs.parse_dubbing(200, json.dumps({"dubbing_id": "d1", "status": status,
                                                     "target_languages": ["fr"]}).encode())


def fal_status(status: str) -> PollResult | None:
    return fal.parse_status(200, json.dumps({"status": status}).encode())


TABLE: list[tuple[str, Callable[[str], PollResult | None], str, PollStatus | None]] = [
    # KIE market (recordInfo ``state``; KIE spells queuing both ways)
    *[("kie-market", market, s, R) for s in ("waiting", "queuing", "queueing", "generating")],
    ("kie-market", market, "success", S), ("kie-market", market, "fail", F),
    ("kie-market", market, "exploded", U),
    # Veo / Flux Kontext (successFlag 0/1/2/3); Luma: 4 = the callback failed, the media exists
    *[(name, flag(parse), v, want) for name, parse in (("kie-veo", kie.parse_record_veo),
                                                       ("kie-kontext", kie.parse_record_kontext))
      for v, want in (("0", R), ("1", S), ("2", F), ("3", F), ("4", U), ("9", U))],
    *[("kie-luma", flag(kie.parse_record_luma), v, want)
      for v, want in (("0", R), ("1", S), ("2", F), ("3", F), ("4", S), ("9", U))],
    # Suno (``status``); CALLBACK_EXCEPTION with tracks is a success (see the decision in suno.py)
    *[("kie-suno", suno, s, R) for s in ("PENDING", "TEXT_SUCCESS", "FIRST_SUCCESS")],
    ("kie-suno", suno, "SUCCESS", S), ("kie-suno", suno, "CALLBACK_EXCEPTION", S),
    ("kie-suno", lambda s: suno(s, tracks=False), "CALLBACK_EXCEPTION", F),
    *[("kie-suno", suno, s, F) for s in ("CREATE_TASK_FAILED", "GENERATE_AUDIO_FAILED",
                                          "SENSITIVE_WORD_ERROR")],
    ("kie-suno", suno, "MYSTERY", U),
    # Runway (record-detail ``state``)
    *[("kie-runway", runway, s, R) for s in ("wait", "waiting", "queueing", "queuing",
                                              "generating")],
    ("kie-runway", runway, "success", S), ("kie-runway", runway, "fail", F),
    ("kie-runway", runway, "paused", U),
    # Replicate predictions and trainings (one status vocabulary)
    ("replicate", predict, "starting", R), ("replicate", predict, "processing", R),
    ("replicate", predict, "succeeded", S), ("replicate", predict, "failed", F),
    ("replicate", predict, "canceled", C), ("replicate", predict, "aborted", C),
    ("replicate", predict, "booting", U),
    # ElevenLabs dubbing
    *[("elevenlabs-dubbing", dubbing, s, R) for s in ("queued", "preparing", "dubbing")],
    ("elevenlabs-dubbing", dubbing, "dubbed", S), ("elevenlabs-dubbing", dubbing, "failed", F),
    ("elevenlabs-dubbing", dubbing, "archived", U),
    # fal queue status: COMPLETED hands over to the result read (None)
    ("fal", fal_status, "IN_QUEUE", R), ("fal", fal_status, "IN_PROGRESS", R),
    ("fal", fal_status, "COMPLETED", None), ("fal", fal_status, "SCHEDULED", U),
]


@pytest.mark.parametrize(("family", "read", "raw", "expected"), TABLE,
                         ids=[f"{row[0]}-{row[2]}" for row in TABLE])
def test_raw_status_maps_to_poll_status(family: str, read: Callable[[str], PollResult | None],
                                        raw: str, expected: PollStatus | None) -> None:
    result = read(raw)
    if expected is None:
        assert result is None
        return
    assert result is not None and result.status is expected, (family, raw, result)
    if expected is S:
        assert result.outputs, "a success must carry its outputs"


NOT_FOUND: list[tuple[str, Callable[[], PollResult | None]]] = [
    ("kie", lambda: kie.parse_record_market(json.dumps({"code": 404, "msg": "Task not found"}))),
    ("kie-422", lambda: kie.parse_record_veo(json.dumps({"code": 422, "msg": "record is null"}))),
    ("replicate", lambda: replicate.parse_status(404, b'{"detail": "Not found."}')),
    ("elevenlabs-dubbing", lambda: elevenlabs.parse_dubbing(404, b'{"detail": "not found"}')),
    ("elevenlabs-stt", lambda: elevenlabs.parse_transcript(404, b'{"detail": "not found"}')),
    ("fal", lambda: fal.parse_status(404, b'{"detail": "Request not found"}')),
]


@pytest.mark.parametrize(("family", "read"), NOT_FOUND, ids=[row[0] for row in NOT_FOUND])
def test_an_unknown_task_is_not_found(family: str, read: Callable[[], PollResult | None]) -> None:
    result = read()
    assert result is not None and result.status is N
