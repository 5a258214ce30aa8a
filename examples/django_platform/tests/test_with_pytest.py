"""The platform's tests under pytest-django, with the library's fixtures."""

import uuid

import pytest
from django.db import connection
from platform_app.models import Job

from reconcile import credits
from reconcile.testing.simulator import Script


@pytest.fixture
def eager(settings):
    settings.RECONCILE = {**settings.RECONCILE, "eager": True, "time_scale": 0.02}


def test_a_job_completes_in_the_request_on_the_test_database(
        eager, reconcile_simulator, reconcile_db, client) -> None:
    reconcile_simulator.script_model("quick", Script(timeline=((0.0, "queued"),
                                                               (0.1, "succeeded"))))
    user = uuid.uuid4()
    with reconcile_db.sessions.begin() as session:
        credits.grant(session, user, "sub", 50, f"test-grant:{uuid.uuid4()}")
    r = client.post("/api/v1/jobs", {"model": "quick"}, content_type="application/json",
                    headers={"X-User-Id": str(user)})
    assert r.status_code == 202, r.json()
    assert connection.settings_dict["NAME"].startswith("test_")
    job = Job.objects.get(pk=r.json()["job_id"])  # the platform's model, the test database
    assert job.status == "completed"
    assert reconcile_simulator.creates() == 1


def test_the_library_rows_of_the_last_test_are_gone(reconcile_db) -> None:
    from reconcile.db.models import CreditBalance

    with reconcile_db.sessions() as session:
        assert session.query(CreditBalance).count() == 0
    assert Job.objects.count() == 0
