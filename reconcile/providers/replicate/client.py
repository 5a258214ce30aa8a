"""The Replicate client (an :class:`AsyncProvider` for predictions or trainings) and the kinds'
factories. Creates go out once (``send_once``); reads are retried by :class:`HttpClient`."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from urllib.parse import quote

import requests

from ...settings import Settings
from ..base import Created, CreateRequest, ListedTask, PollResult
from ..http import cancel_once, provider_http, send_create
from ..outputs import declared_output
from . import listing
from ._common import Resource, to_error
from .listing import MAX_LIST_PAGES
from .predictions import build_create, parse_create, parse_status


class ReplicateClient:
    """Predictions or trainings against one Replicate account (an :class:`AsyncProvider`)."""

    def __init__(
        self,
        settings: Settings,
        session: requests.Session | None = None,
        *,
        resource: Resource = "predictions",
        sleep: Callable[[float], None] = time.sleep,
        read_retries: int = 3,
        max_pages: int = MAX_LIST_PAGES,
    ) -> None:
        self.resource = resource
        self.name = "replicate-prediction" if resource == "predictions" else "replicate-training"
        self.max_pages = max_pages
        self.http = provider_http(
            settings.replicate_base_url,
            {"Authorization": f"Bearer {settings.replicate_api_key}"},
            settings, session, read_retries=read_retries, sleep=sleep,
        )

    def create(self, request: CreateRequest) -> Created:
        path, body = build_create(request, self.resource)
        headers = {}
        if request.extra.get("cancel_after"):
            # Replicate's own deadline (e.g. "30m"): a forgotten prediction stops costing money.
            headers["Cancel-After"] = str(request.extra["cancel_after"])
        response = send_create(self.http, to_error, "POST", path, json=body, headers=headers)
        return parse_create(response.status_code, response.content, response.headers)

    def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
        response = self.http.read("GET", f"/v1/{self.resource}/{quote(task_id, safe='')}")
        return parse_status(response.status_code, response.content, response.headers,
                            spec=declared_output("replicate", model))

    def cancel(self, task_id: str, *, model: str | None = None) -> bool:
        # Cancelling is idempotent upstream, but best-effort here: a transport error is "not
        # confirmed", which the caller treats like any refused cancel.
        return cancel_once(self.http, "POST", f"/v1/{self.resource}/{quote(task_id, safe='')}/cancel")

    def find_created(self, job_id: str, created_after: datetime) -> ListedTask | None:
        """The task whose ``webhook`` carries ``job_id`` (:func:`.listing.find_created`)."""
        return listing.find_created(self.http, self.resource, job_id, created_after,
                                    self.max_pages)


def prediction_client(
    settings: Settings, session: requests.Session | None = None
) -> ReplicateClient:
    """Factory for the ``replicate-prediction`` kind."""
    return ReplicateClient(settings, session, resource="predictions")


def training_client(settings: Settings, session: requests.Session | None = None) -> ReplicateClient:
    """Factory for the ``replicate-training`` kind."""
    return ReplicateClient(settings, session, resource="trainings")
