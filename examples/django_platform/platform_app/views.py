"""The platform's API: submit a job through the library, read it, cancel it. The user is the
``X-User-Id`` header (the example's stand-in for authentication)."""

import json
import uuid

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from reconcile import api
from reconcile.contrib.django import runtime

CREDITS_PER_JOB = 10


def _user(request: HttpRequest) -> uuid.UUID | None:
    try:
        return uuid.UUID(request.headers.get("X-User-Id", ""))
    except ValueError:
        return None


def _answer(response: tuple[int, dict]) -> JsonResponse:
    status, body = response
    return JsonResponse(body, status=status)


def _unauthenticated() -> JsonResponse:
    return JsonResponse({"error": {"type": "authentication_error", "code": "UNAUTHENTICATED",
                                   "message": "X-User-Id is required"}}, status=401)


@csrf_exempt
@require_POST
def submit_job(request: HttpRequest) -> JsonResponse:
    """POST {"model": ..., "input": {...}}: the simulator plays the provider (kie-standard)."""
    user = _user(request)
    if user is None:
        return _unauthenticated()
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return JsonResponse({"error": {"type": "invalid_request_error", "code": "INVALID_PARAM",
                                       "message": "a JSON object with a model is required",
                                       "param": "model"}}, status=400)
    return _answer(api.submit(runtime(), user, body.get("provider_kind", "kie-standard"),
                              body["model"], body.get("input", {}), CREDITS_PER_JOB,
                              job_type="image", idempotency_key=request.headers.get("Idempotency-Key")))


class _NotAll(Exception):
    def __init__(self, answer: tuple[int, dict]) -> None:
        self.answer = answer


@csrf_exempt
@require_POST
def submit_batch(request: HttpRequest) -> JsonResponse:
    """POST {"jobs": [{"model": ...}, ...]}: all the jobs or none, in one transaction. Each
    job's create waits for the commit; when one submit is refused (402: not enough credits for
    all) the transaction rolls back and the library withdraws the jobs already submitted
    (cancelled, refunded; nothing reaches the provider)."""
    user = _user(request)
    if user is None:
        return _unauthenticated()
    try:
        jobs = json.loads(request.body or b"{}").get("jobs")
    except (ValueError, AttributeError):
        jobs = None
    if not isinstance(jobs, list) or not all(isinstance(j, dict) and isinstance(j.get("model"), str)
                                             for j in jobs):
        return JsonResponse({"error": {"type": "invalid_request_error", "code": "INVALID_PARAM",
                                       "message": "jobs: a list of objects with a model",
                                       "param": "jobs"}}, status=400)
    try:
        with transaction.atomic():
            ids = []
            for spec in jobs:
                status, body = api.submit(runtime(), user, "kie-standard", spec["model"],
                                          spec.get("input", {}), CREDITS_PER_JOB,
                                          job_type="image")
                if status != 202:
                    raise _NotAll((status, body))
                ids.append(body["job_id"])
    except _NotAll as refused:
        return _answer(refused.answer)
    return JsonResponse({"job_ids": ids}, status=202)


@require_GET
def job(request: HttpRequest, job_id: uuid.UUID) -> JsonResponse:
    user = _user(request)
    return _unauthenticated() if user is None else _answer(api.snapshot(runtime(), user, job_id))


@csrf_exempt
@require_POST
def cancel_job(request: HttpRequest, job_id: uuid.UUID) -> JsonResponse:
    user = _user(request)
    return _unauthenticated() if user is None else _answer(api.cancel(runtime(), user, job_id))
