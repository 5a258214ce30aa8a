"""The bad-input tests' shared pieces: the timelines, a hypothesis profile for fuzzing
against the database, an input per family, and the helpers that submit a funded job (without
enqueueing it) and read its row back.
"""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import HealthCheck, settings
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import Job
from tests.integration.harness import fund

INSTANT = ((0.0, "queued"), (0.0, "succeeded"))
FOREVER = ((0.0, "queued"), (0.0, "running"))
DB_FUZZ = settings(deadline=None, max_examples=40,
                   suppress_health_check=[HealthCheck.function_scoped_fixture,
                                          HealthCheck.too_slow])
FAMILIES = {
    "kie-standard": ("seedream/4.5-edit", {"prompt": "a cat"}),
    "kie-veo": ("veo3_fast", {"prompt": "a dog"}),
    "replicate-prediction": ("owner/model:abc123", {"prompt": "x"}),
    "elevenlabs-async": ("dubbing", {"source_url": "https://example.com/a.mp4", "target_lang": "es"}),
    "fal-queue": ("fal-ai/flux/dev", {"prompt": "x"}),
}


def load_job(db: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def submit(rt: Any, db: sessionmaker[Session], kind: str, user: uuid.UUID | None = None,
           credits_: int = 40) -> uuid.UUID:
    user = user or uuid.uuid4()
    fund(db, user, 10_000)
    model, inp = FAMILIES.get(kind, ("m/x", {"prompt": "x"}))
    return lifecycle.submit_job(rt, user, kind, model, inp, credits_, job_type="image",
                                enqueue=False).job_id
