"""KIE.ai parsers on arbitrary JSON (hypothesis): every record parser, the create parser
and the chat parser return or raise a ReconcileError, never anything else.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings, strategies as st

from reconcile.errors import ReconcileError
from reconcile.providers import kie

# ------------------------------------------------------------------ arbitrary JSON

# Scalars include the values that steer the parsers deeper (states, flags, odd URLs).
STEERING = ["success", "fail", "generating", "SUCCESS", "FIRST_SUCCESS", "wait", "1", "4",
            "http://[bad", "https://cdn.test/a.mp4", '{"resultUrls": ["https://c.test/x"]}',
            '{"callBackUrl": "https://h.test/?job_id=j"}', "Task not found", "2025-06-06 10:30:00"]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.sampled_from(STEERING),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
FIELDS = ["taskId", "state", "param", "paramJson", "resultJson", "failCode", "failMsg", "progress",
          "completeTime", "createTime", "successFlag", "response", "errorCode", "errorMessage",
          "status", "sunoData", "audioUrl", "resultUrls", "resultImageUrl", "videoInfo",
          "videoUrl", "generateParam", "choices", "message", "content"]
leaf = st.sampled_from(STEERING) | st.integers(0, 5) | json_values
url_lists = st.lists(st.sampled_from(STEERING) | st.none() | json_values, max_size=3)
inner = st.dictionaries(st.sampled_from(FIELDS), leaf | url_lists, max_size=4)
# Records shaped like KIE's, so the fuzz reaches the state/flag/media code, not just the envelope.
records = st.dictionaries(st.sampled_from(FIELDS),
                          leaf | inner | url_lists | st.lists(inner, max_size=3), max_size=8)
bodies = st.one_of(
    json_values,
    records,
    st.builds(lambda data, key: {"code": 200, key: "success", "data": data},
              records, st.sampled_from(["msg", "message"])),
    st.builds(lambda code, data, key: {"code": code, key: "m", "data": data},
              st.sampled_from([200, 400, 404, 429, 455, 500, "200", 200.0]) | json_values,
              json_values | records, st.sampled_from(["msg", "message"])),
    st.builds(lambda data: {"data": data, "requestId": "r"}, json_values | records),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40),
)
PARSERS = [kie.parse_record_market, kie.parse_record_veo, kie.parse_record_suno,
           kie.parse_record_kontext, kie.parse_record_luma, kie.parse_record_runway]


@settings(deadline=None, max_examples=300)
@given(body=bodies, status=st.sampled_from([200, 201, 400, 404, 429, 500, 503]))
def test_parsers_raise_only_library_errors_on_arbitrary_json(body: Any, status: int) -> None:
    """Every parse function either returns or raises a ReconcileError, whatever the JSON."""
    for parse in PARSERS:
        try:
            parse(body, status, {"Retry-After": "x"})
        except ReconcileError:
            pass
    for parse_two in (kie.parse_create, kie.parse_chat):
        try:
            parse_two(status, body, {})
        except ReconcileError:
            pass
