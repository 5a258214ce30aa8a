"""The platform's own tests, run by Django's test runner (``manage.py test``; the settings name
the library's ``ReconcileTestRunner``, which closes the library's connections before the test
database is dropped). The library works on the test database; the provider is the shipped
simulator; ``RECONCILE["eager"]`` runs each job's create and polls inline, in the request.

``TransactionTestCase``, not ``TestCase``: the library commits on its own connection, so the
platform's rows must be committed for it (and its rows for the platform) to be seen.
"""

import uuid

from django.conf import settings
from django.db import connection, transaction
from django.test import TransactionTestCase, override_settings

from reconcile import api, credits
from reconcile.contrib.django import runtime
from reconcile.contrib.django.testing import flush, simulated
from reconcile.testing.simulator import Script

from .models import Job

QUICK = Script(timeline=((0.0, "queued"), (0.05, "running"), (0.1, "succeeded")))


def grant(user: uuid.UUID, amount: int) -> None:
    with runtime().sessions.begin() as session:
        credits.grant(session, user, "sub", amount, f"test-grant:{uuid.uuid4()}")


def balance(user: uuid.UUID) -> int:
    with runtime().sessions.begin() as session:
        held = credits.lock_balance(session, user)
        return held.sub + held.topup


@override_settings(RECONCILE={**settings.RECONCILE, "eager": True, "time_scale": 0.02})
class EagerJobs(TransactionTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.sim = cls.enterClassContext(simulated())

    def setUp(self) -> None:
        self.sim.reset()
        self.sim.script_model("quick", QUICK)
        self.user = uuid.uuid4()

    def tearDown(self) -> None:
        flush()  # the library's rows; TransactionTestCase empties the platform's tables

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        r = self.client.post(path, body, content_type="application/json",
                             headers={"X-User-Id": str(self.user)})
        return r.status_code, r.json()

    def test_the_library_works_on_the_test_database(self) -> None:
        test_database = connection.settings_dict["NAME"]
        self.assertIn("test", test_database)
        from sqlalchemy.engine import make_url

        self.assertTrue(make_url(runtime().settings.database_url).database.endswith(
            test_database.rsplit("/", 1)[-1]))
        grant(self.user, 100)
        status, body = self.post("/api/v1/jobs", {"model": "quick"})
        self.assertEqual(status, 202, body)
        # the platform's own model reads the row the library wrote, in the test database
        row = Job.objects.get(pk=body["job_id"])
        self.assertEqual((row.user_id, row.status), (self.user, "completed"))

    def test_eager_runs_the_create_and_the_polls_in_the_request(self) -> None:
        grant(self.user, 100)
        status, body = self.post("/api/v1/jobs", {"model": "quick", "input": {"prompt": "a cat"}})
        self.assertEqual(status, 202, body)
        r = self.client.get(f"/api/v1/jobs/{body['job_id']}", headers={"X-User-Id": str(self.user)})
        snapshot = r.json()
        self.assertEqual((snapshot["state"], snapshot["credits_actual"]), ("completed", 10))
        self.assertEqual(len(snapshot["outputs"]), 1)
        self.assertEqual(self.sim.creates(), 1)
        self.assertEqual(balance(self.user), 90)

    def test_the_create_waits_for_the_platforms_commit(self) -> None:
        grant(self.user, 100)
        with transaction.atomic():
            status, body = api.submit(runtime(), self.user, "kie-standard", "quick", {}, 10,
                                      job_type="image")
            self.assertEqual(status, 202, body)
            self.assertEqual(self.sim.creates(), 0)  # not before the commit
        self.assertEqual(self.sim.creates(), 1)
        self.assertEqual(Job.objects.get(pk=body["job_id"]).status, "completed")

    def test_a_batch_refused_part_way_rolls_back_and_nothing_reaches_the_provider(self) -> None:
        grant(self.user, 25)  # two jobs of 10, not three
        status, body = self.post("/api/v1/batches", {"jobs": [{"model": "quick"}] * 3})
        self.assertEqual(status, 402, body)
        withdrawn = Job.objects.filter(user_id=self.user)
        self.assertEqual(sorted(j.status for j in withdrawn), ["cancelled", "cancelled"])
        self.assertEqual(self.sim.creates(), 0)
        self.assertEqual(balance(self.user), 25)  # both reservations refunded
        r = self.client.get(f"/api/v1/jobs/{withdrawn[0].pk}", headers={"X-User-Id": str(self.user)})
        self.assertEqual(r.json()["state"], "canceled")

    def test_a_committed_batch_runs_every_job_after_the_commit(self) -> None:
        grant(self.user, 100)
        status, body = self.post("/api/v1/batches", {"jobs": [{"model": "quick"}] * 2})
        self.assertEqual(status, 202, body)
        self.assertEqual(sorted(Job.objects.filter(pk__in=body["job_ids"]).values_list(
            "status", flat=True)), ["completed", "completed"])
        self.assertEqual(self.sim.creates(), 2)

    def test_a_rolled_back_savepoint_withdraws_only_its_own_submit(self) -> None:
        grant(self.user, 100)

        def submit() -> str:
            return api.submit(runtime(), self.user, "kie-standard", "quick", {}, 10,
                              job_type="image")[1]["job_id"]

        with transaction.atomic():
            try:
                with transaction.atomic():
                    inner = submit()
                    raise RuntimeError("the platform gives up on this one")
            except RuntimeError:
                pass
            self.assertEqual(Job.objects.get(pk=inner).status, "cancelled")
            outer = submit()
        self.assertEqual(Job.objects.get(pk=outer).status, "completed")
        self.assertEqual(self.sim.creates(), 1)
        self.assertEqual(balance(self.user), 90)
