"""KIE.ai reads and kinds: each client polls its API's record endpoint with the task id and
the bearer key; cancel and listing are unsupported; every KIE kind builds a client of this
module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import responses
from responses import matchers

from reconcile.kinds import get_kind
from reconcile.providers import AsyncProvider, PollStatus, SyncProvider, kie
from tests.unit._kie_helpers import BASE, SETTINGS, client, flagged, market, runway, suno

# ------------------------------------------------------------------ poll I/O, the kinds

POLL_ENDPOINTS = [
    (kie.market_client, "/api/v1/jobs/recordInfo", market("waiting")),
    (kie.veo_client, "/api/v1/veo/record-info", flagged(0)),
    (kie.suno_client, "/api/v1/generate/record-info", suno("PENDING")),
    (kie.kontext_client, "/api/v1/flux/kontext/record-info", flagged(0)),
    (kie.luma_client, "/api/v1/modify/record-info", flagged(0)),
    (kie.runway_client, "/api/v1/runway/record-detail", runway("wait")),
]


@pytest.mark.parametrize(("factory", "path", "body"), POLL_ENDPOINTS)
@responses.activate
def test_each_client_reads_its_record_endpoint(
    factory: Callable[..., kie.KieClient], path: str, body: dict[str, Any]
) -> None:
    """poll GETs the API's record endpoint with ?taskId= and the bearer key."""
    responses.get(f"{BASE}{path}", json=body,
                  match=[matchers.query_param_matcher({"taskId": "abc"})])
    c = factory(SETTINGS, None)
    assert isinstance(c, AsyncProvider)
    assert c.poll("abc").status is PollStatus.RUNNING
    assert responses.calls[0].request.headers["Authorization"] == "Bearer sk-kie"


def test_cancel_and_listing_are_unsupported() -> None:
    """KIE has no cancel endpoint and no listing."""
    c = client()
    assert c.cancel("t") is False
    assert c.find_created("job-42", created_after=None) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "name"),
    [("kie-standard", "kie-market"), ("kie-kling3", "kie-market"), ("kie-lip-sync", "kie-market"),
     ("kie-veo", "kie-veo"), ("kie-suno", "kie-suno"), ("kie-kontext", "kie-kontext"),
     ("kie-luma", "kie-luma"), ("kie-runway", "kie-runway"), ("kie-llm", "kie-llm")],
)
def test_registry_builds_every_kie_kind(kind: str, name: str) -> None:
    """Every KIE kind resolves to a client of this module."""
    registered = get_kind(kind)
    assert registered is not None
    built = registered.build(SETTINGS, None)
    assert built.name == name
    assert isinstance(built, SyncProvider if registered.sync else AsyncProvider)
