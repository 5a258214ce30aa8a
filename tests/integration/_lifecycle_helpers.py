"""The lifecycle tests' shared pieces: the timelines, the families, and the helpers that
submit a funded job and read its row back. Every lifecycle test runs on both ledger backends:
its module says ``pytestmark = pytest.mark.usefixtures("on_each_ledger")`` (the fixture is in
``tests/integration/ledgers.py``, through the directory's conftest).
"""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle
from reconcile.db.models import Job
from tests.integration.harness import fund

INSTANT = ((0.0, "queued"), (0.0, "succeeded"))
FOREVER = ((0.0, "queued"), (0.0, "running"))

FAMILIES = [
    ("kie-standard", "seedream/4.5-edit", {"prompt": "a cat"}),
    ("kie-veo", "veo3_fast", {"prompt": "a dog"}),
    ("kie-suno", "V4_5", {"prompt": "a song", "customMode": False, "instrumental": False}),
    ("replicate-prediction", "owner/model:abc123", {"prompt": "x"}),
    ("elevenlabs-async", "dubbing", {"source_url": "https://example.com/a.mp4", "target_lang": "es"}),
    ("fal-queue", "fal-ai/flux/dev", {"prompt": "x"}),
]


def load_job(db: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    with db() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job


def submit(rt, db, kind="kie-standard", model="m", inp=None, amount=40, user=None, **kw):  # type: ignore[no-untyped-def]
    user = user or uuid.uuid4()
    fund(db, user)
    return lifecycle.submit_job(rt, user, kind, model, inp or {"prompt": "x"}, amount,
                                job_type="image", **kw).job_id
