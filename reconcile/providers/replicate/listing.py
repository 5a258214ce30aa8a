"""Replicate listings: the evidence an uncertain create leaves (``GET /v1/predictions``, newest
first; a task's ``webhook`` echoes the planted job id)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

from pydantic import ValidationError

from ..base import ListedTask
from ..http import HttpClient, body_json as _json
from ._common import Prediction, Resource, planted_job_id, to_error

MAX_LIST_PAGES = 10  # find_created is evidence, not a crawl: bound the cost of one search


@dataclass(frozen=True)
class ListPage:
    """One page of ``GET /v1/predictions``: the tasks on it and the next page's URL."""

    tasks: tuple[ListedTask, ...]
    next: str | None


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def parse_list(
    status_code: int, body: str | bytes | None, headers: Mapping[str, str] | None = None
) -> ListPage:
    """One page of a listing; items we cannot parse are skipped (this is evidence, not truth)."""
    if not 200 <= status_code < 300:
        raise to_error("read", status_code, body, headers)
    data = _json(body)
    if not isinstance(data, Mapping) or not isinstance(data.get("results"), list):
        raise to_error("read", status_code, body, headers)
    tasks = []
    for item in data["results"]:
        try:
            prediction = Prediction.model_validate(item)
        except ValidationError:
            continue
        created = _aware(prediction.created_at) if prediction.created_at else None
        tasks.append(ListedTask(prediction.id, created, planted_job_id(prediction.webhook)))
    next_url = data.get("next")
    return ListPage(tuple(tasks), next_url if isinstance(next_url, str) and next_url else None)


def find_created(http: HttpClient, resource: Resource, job_id: str, created_after: datetime,
                 max_pages: int = MAX_LIST_PAGES) -> ListedTask | None:
    """The task whose ``webhook`` carries ``job_id``, created after ``created_after``.

    Pages newest-first and stops at ``max_pages`` or once a page is entirely older than
    ``created_after`` (trainings have no documented ``created_after`` filter).
    """
    since = _aware(created_after)
    path: str = f"/v1/{resource}"
    params: dict[str, str] | None = None
    if resource == "predictions":
        params = {"created_after": since.isoformat().replace("+00:00", "Z")}
    for _ in range(max_pages):
        response = http.read("GET", path, params=params)
        page = parse_list(response.status_code, response.content, response.headers)
        for task in page.tasks:
            if task.planted_job_id == job_id and (
                task.created_at is None or task.created_at >= since
            ):
                return task
        dated = [t.created_at for t in page.tasks if t.created_at is not None]
        if not page.next or not _same_origin(http, page.next) or (dated and max(dated) < since):
            return None
        path, params = page.next, None
    return None


def _same_origin(http: HttpClient, url: str) -> bool:
    # ``next`` is a full URL; never send the bearer token to a host other than Replicate's.
    here, there = urlsplit(http.base_url), urlsplit(url)
    return (here.scheme, here.netloc) == (there.scheme, there.netloc)
