"""The KIE task client (an AsyncProvider for one :class:`KieApi`) and the kinds' factories."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

import requests

from ...errors import CreateUncertain
from ...settings import Settings
from ..base import Created, CreateRequest, ListedTask, PollResult
from ._common import KieApi, http_client, parse_create
from .flags import KONTEXT, LUMA, VEO
from .market import MARKET
from .runway import RUNWAY
from .suno import SUNO


class KieClient:
    """An AsyncProvider for one KIE task API: creates are sent once, reads are retried."""

    def __init__(self, api: KieApi, settings: Settings, session: requests.Session | None = None,
                 *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.api = api
        self.name = api.name
        self.http = http_client(settings, session, read_timeout=settings.read_timeout, sleep=sleep)

    def create(self, request: CreateRequest) -> Created:
        body = self.api.build(request)
        # Only our callBackUrl: it carries the job id the sweep later trusts as evidence.
        body.pop("callBackUrl", None)
        if request.webhook_url:
            body["callBackUrl"] = request.webhook_url
        try:
            response = self.http.send_once("POST", self.api.create_path, json=body)
        except requests.RequestException as exc:  # sent or not, we cannot know: uncertain
            raise CreateUncertain(f"KIE create: {exc.__class__.__name__}: {exc}") from exc
        return parse_create(response.status_code, response.content, response.headers)

    def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
        response = self.http.read("GET", self.api.record_path, params={"taskId": task_id})
        return self.api.parse(response.content, response.status_code, response.headers)

    def cancel(self, task_id: str, *, model: str | None = None) -> bool:
        return False  # KIE has no cancel endpoint

    def find_created(self, job_id: str, created_after: datetime) -> ListedTask | None:
        return None  # KIE has no task listing; evidence comes from webhooks and recordInfo


def _factory(api: KieApi, name: str, doc: str) -> Callable[[Settings, requests.Session | None],
                                                          KieClient]:
    def factory(settings: Settings, session: requests.Session | None = None) -> KieClient:
        return KieClient(api, settings, session)

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = doc
    return factory


market_client = _factory(MARKET, "market_client",
                         "kie-standard, kie-kling3 and kie-lip-sync: the market jobs API.")
veo_client = _factory(VEO, "veo_client", "kie-veo: Veo.")
suno_client = _factory(SUNO, "suno_client", "kie-suno: Suno.")
kontext_client = _factory(KONTEXT, "kontext_client", "kie-kontext: Flux Kontext.")
luma_client = _factory(LUMA, "luma_client", "kie-luma: Luma modify.")
runway_client = _factory(RUNWAY, "runway_client", "kie-runway: Runway.")
