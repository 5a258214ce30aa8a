"""Issue 25, suspected item confirmed: the example platform priced by kind and accepted any
model — a customer's own Replicate model or fal app could do billable work upstream, fail on
purpose and be refunded in full. acme's catalogue (``examples/platform/acme/catalog.py``) is the
submit validator: any other model is refused with 400 ``INVALID_PARAM`` before anything is
reserved, written or sent upstream."""

from __future__ import annotations

import importlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import api
from reconcile.db.models import CreditTransaction, Job, UsageLog
from reconcile.kinds import get_kind
from reconcile.testing.simulator import Simulator
from tests.integration.harness import fund, make_runtime

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "platform"


@pytest.fixture
def catalog(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.delenv("ACME_MODELS", raising=False)
    yield importlib.import_module("acme.catalog")
    sys.modules.pop("acme.catalog", None)


def _counts(db: sessionmaker[Session]) -> tuple[int, ...]:
    with db() as s:
        return tuple(s.execute(select(func.count()).select_from(m)).scalar_one()
                     for m in (Job, UsageLog, CreditTransaction))


@pytest.mark.parametrize(("kind", "model"), [
    ("replicate-prediction", "attacker/own-model:0123456789abcdef"),  # a customer's own model
    ("replicate-prediction", "black-forest-labs/flux-schnell:other-version"),
    ("fal-queue", "attacker/own-fal-app"),
    ("kie-standard", "seedream/4.5-edit "),  # exact match only
    ("kie-veo", "veo3_fast"),  # a kind acme does not offer
    ("anthropic-sync", "claude-x"),
])
def test_a_model_outside_the_catalogue_is_refused_and_nothing_happens(
        catalog: ModuleType, db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        kind: str, model: str) -> None:
    rt, queues = make_runtime(db, simulator, tmp_path)
    user = uuid.uuid4()
    fund(db, user)
    before = _counts(db)
    status, body = api.submit(rt, user, kind, model, {"prompt": "x"}, 10, job_type="image",
                              inline=True, validator=catalog.allowed_model)
    assert status == 400, body
    assert (body["error"]["code"], body["error"]["param"]) == ("INVALID_PARAM", "model")
    assert _counts(db) == before  # nothing reserved or written
    assert simulator.creates() == 0 and not queues.creates  # nothing sent upstream


def test_a_catalogue_model_is_accepted(catalog: ModuleType, db: sessionmaker[Session],
                                       simulator: Simulator, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    rt, _ = make_runtime(db, simulator, tmp_path)
    user = uuid.uuid4()
    fund(db, user)
    for kind, models in catalog.MODELS.items():  # every entry names a real kind
        assert models and get_kind(kind) is not None, kind
    status, body = api.submit(rt, user, "kie-standard", "seedream/4.5-edit", {"prompt": "x"}, 10,
                              job_type="image", validator=catalog.allowed_model)
    assert status == 202, body
    monkeypatch.setenv("ACME_MODELS", "kie-standard=m, fal-queue=fal-ai/flux/dev")
    assert catalog.models() == {"kie-standard": frozenset({"m"}),
                                "fal-queue": frozenset({"fal-ai/flux/dev"})}
    status, body = api.submit(rt, user, "kie-standard", "seedream/4.5-edit", {"prompt": "x"}, 10,
                              job_type="image", validator=catalog.allowed_model)
    assert status == 400, body
