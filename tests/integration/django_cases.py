"""The Django integration under attack, run inside the example platform's own ``manage.py test``
(``tests/integration/test_django_platform.py`` names this module beside ``platform_app``: one
test database for both, on PostgreSQL). Not collected by pytest itself: it needs the example's
Django settings.

The create that waits for the platform's commit (``reconcile.contrib.django.enqueue``): a commit
is never taken for a rollback, a rollback never refunds a job the provider accepted, and a send
that fails after the commit leaves the job to the sweep. The admin's operator actions: Django's
CSRF check, and two staff racing one job (one wins, one record, the ledger clean).
"""

from __future__ import annotations

import gc
import threading
import uuid
from datetime import timedelta
from typing import Any
from unittest import mock

from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import transaction
from django.test import Client, TransactionTestCase, override_settings
from platform_app.models import Job

from reconcile import api, credits, lifecycle, tasks
from reconcile.contrib.django import runtime
from reconcile.contrib.django.models import OperatorAction
from reconcile.contrib.django.testing import flush, simulated
from reconcile.sweep.tick import sweep
from reconcile.testing.simulator import Script

QUICK = Script(timeline=((0.0, "queued"), (0.05, "running"), (0.1, "succeeded")))
SLOW = Script(timeline=((0.0, "queued"), (0.05, "running"), (600.0, "succeeded")))
EAGER = {**settings.RECONCILE, "eager": True, "time_scale": 0.02}


def priced_at_seven() -> dict[str, Any]:
    """``RECONCILE["runtime_options"]``: the platform's hooks for the library's runtime."""
    return {"pricing_hook": lambda job, result: 7}


SENT = {**EAGER, "eager": False}  # creates and polls go to the broker (``tasks.send``, mocked)


class _Cases(TransactionTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.sim = cls.enterClassContext(simulated())

    def setUp(self) -> None:
        sent = mock.patch.object(tasks, "send")
        self.sent = sent.start()
        self.addCleanup(sent.stop)
        self.sim.reset()
        self.sim.script_model("quick", QUICK)
        self.sim.script_model("slow", SLOW)
        self.user = uuid.uuid4()
        with runtime().sessions.begin() as session:
            credits.grant(session, self.user, "sub", 100, f"test-grant:{uuid.uuid4()}")

    def tearDown(self) -> None:
        flush()

    def submit(self, model: str = "quick") -> str:
        status, body = api.submit(runtime(), self.user, "kie-standard", model, {}, 10,
                                  job_type="image")
        self.assertEqual(status, 202, body)
        return str(body["job_id"])

    def accepted(self) -> str:
        """A job whose create a worker ran: accepted upstream, processing (its poll sent)."""
        job_id = self.submit("slow")
        lifecycle.create_step(runtime(), uuid.UUID(job_id))
        self.assertEqual(self.row(job_id)[:2], ("processing", "accepted"))
        return job_id

    def sweep_later(self) -> None:
        """A sweep tick an hour from now, its creates and polls run here (eager)."""
        with override_settings(RECONCILE=EAGER):
            rt = runtime()
            sweep(rt, now=rt.now() + timedelta(hours=1))

    def balance(self) -> int:
        with runtime().sessions.begin() as session:
            held = credits.lock_balance(session, self.user)
            return held.sub + held.topup

    def audit(self) -> list[Any]:
        with runtime().sessions() as session:
            return credits.audit(session, grace=timedelta(0))

    def row(self, job_id: str) -> tuple[str, str | None, int | None]:
        job = Job.objects.get(pk=job_id)
        with runtime().sessions() as session:
            from reconcile.db.models import Job as LibraryJob

            library = session.get(LibraryJob, uuid.UUID(job_id))
            assert library is not None
            return job.status, library.submission_state, library.credits_actual


@override_settings(RECONCILE=SENT)
class CommitAwareEnqueue(_Cases):
    def test_a_commit_is_not_taken_for_a_rollback_when_an_earlier_on_commit_hook_raises(
            self) -> None:
        """The platform's transaction commits; its own on-commit hook, registered before the
        submit, raises, so Django drops the create's callback without calling it. The job is
        the platform's now: it is never withdrawn (cancelled, refunded) as if rolled back, and
        the sweep sends its create."""
        def platform_hook() -> None:
            raise RuntimeError("the platform's own on-commit hook fails")

        with self.assertRaises(RuntimeError):
            with transaction.atomic():
                transaction.on_commit(platform_hook)
                job_id = self.submit()
        gc.collect()  # whatever still held Django's list of callbacks lets it go
        self.assertEqual(self.row(job_id), ("pending", "not_started", None))
        self.assertEqual(self.balance(), 90)  # still reserved, never refunded
        self.assertEqual((self.sim.creates(), self.sent.call_count), (0, 0))
        self.sweep_later()  # past the not-started age: the sweep sends the create
        self.assertEqual(self.row(job_id), ("completed", "accepted", 10))
        self.assertEqual(self.sim.creates(), 1)
        self.assertEqual(self.audit(), [])

    def test_a_rollback_after_the_create_was_sent_refunds_nothing(self) -> None:
        """The platform's transaction stays open past the sweep's not-started age, the sweep's
        create is accepted upstream, then the transaction rolls back: the job the provider
        accepted is neither cancelled nor refunded (the withdraw's compare-and-set on
        not_started loses); it runs and is paid for once."""
        with self.assertRaises(RuntimeError):
            with transaction.atomic():
                job_id = self.accepted()  # the sweep's create, run by a worker
                self.assertEqual(self.sim.creates(), 1)
                raise RuntimeError("the platform's request fails after all")
        gc.collect()
        self.assertEqual(self.row(job_id), ("processing", "accepted", None))
        self.assertEqual(self.balance(), 90)  # held for the job upstream
        (task_id,) = self.sim.tasks
        self.sim.set_state(task_id, "succeeded")
        self.sweep_later()  # the job's poll chain: the sweep reads it
        self.assertEqual(self.row(job_id), ("completed", "accepted", 10))
        self.assertEqual((self.sim.creates(), self.balance()), (1, 90))
        self.assertEqual(self.audit(), [])

    def test_a_rollback_withdraws_the_submits_of_the_savepoints_released_inside_it(
            self) -> None:
        with self.assertRaises(RuntimeError):
            with transaction.atomic():
                first = self.submit()
                with transaction.atomic():
                    inner = self.submit()
                    with transaction.atomic():
                        innermost = self.submit()
                # a released savepoint keeps its submits; the outer rollback takes them all
                raise RuntimeError("the platform's request fails")
        gc.collect()
        for job_id in (first, inner, innermost):
            self.assertEqual(self.row(job_id), ("cancelled", "not_started", 0))
        self.assertEqual((self.sim.creates(), self.sent.call_count, self.balance()), (0, 0, 100))
        self.assertEqual(self.audit(), [])

    def test_the_platforms_hooks_reach_the_runtime_its_views_and_workers_use(self) -> None:
        """``RECONCILE["runtime_options"]`` names the platform's hooks (a pricing hook here):
        ``runtime()`` builds with them and installs that runtime for the library's tasks in the
        process, so a completion commits the priced amount, not the whole reservation."""
        from reconcile import tasks as library_tasks

        with override_settings(RECONCILE={**EAGER, "runtime_options":
                                          "django_cases.priced_at_seven"}):
            rt = runtime()
            self.assertIs(library_tasks.get_runtime(), rt)
            job_id = self.submit()
        self.assertEqual(self.row(job_id), ("completed", "accepted", 7))
        self.assertEqual(self.balance(), 93)
        self.assertEqual(self.audit(), [])

    def test_a_send_that_fails_after_the_commit_leaves_the_job_to_the_sweep(self) -> None:
        """The broker is down when the committed transaction's create is sent: the job is
        neither lost nor withdrawn; the sweep sends its create."""
        self.sent.side_effect = ConnectionError("broker down")
        with transaction.atomic():
            job_id = self.submit()
        self.assertEqual(self.sent.call_args.args[0], "reconcile.create")
        gc.collect()
        self.assertEqual(self.row(job_id), ("pending", "not_started", None))
        self.assertEqual(self.balance(), 90)
        self.sweep_later()
        self.assertEqual(self.row(job_id), ("completed", "accepted", 10))
        self.assertEqual((self.sim.creates(), self.balance()), (1, 90))


@override_settings(RECONCILE=SENT)
class AdminActions(_Cases):
    def setUp(self) -> None:
        super().setUp()
        act = Permission.objects.filter(content_type__app_label="reconcile")
        self.staff = [User.objects.create_user(name, is_staff=True) for name in ("ann", "cy")]
        for user in self.staff:
            user.user_permissions.add(*act)

    def client_for(self, user: User, **options: Any) -> Client:
        client = Client(**options)
        client.force_login(user)
        return client

    def test_an_act_post_without_the_csrf_token_is_refused(self) -> None:
        job_id = self.accepted()
        client = self.client_for(self.staff[0], enforce_csrf_checks=True)
        r = client.post(f"/admin/reconcile/job/{job_id}/act/",
                        {"action": "fail", "reason": "no token"})
        self.assertEqual(r.status_code, 403)
        self.assertEqual(self.row(job_id)[0], "processing")
        self.assertFalse(OperatorAction.objects.exists())

    def test_a_reason_with_markup_and_control_characters_is_kept_and_shown_escaped(
            self) -> None:
        job_id = self.accepted()
        client = self.client_for(self.staff[0])
        r = client.post(f"/admin/reconcile/job/{job_id}/act/",
                        {"action": "fail", "reason": "ticket 7\x00 drop"})
        self.assertContains(r, "Null characters are not allowed.")  # Django's form refuses it
        self.assertEqual(self.row(job_id)[0], "processing")
        reason = "ticket 7 <script>alert(1)</script> \x1b[31mred\u202egnp.exe"
        r = client.post(f"/admin/reconcile/job/{job_id}/act/",
                        {"action": "fail", "reason": reason})
        self.assertEqual(r.status_code, 302)
        (record,) = OperatorAction.objects.filter(job_id=job_id)
        self.assertEqual((record.reason, record.operator, record.via),
                         (reason, "ann", "django-admin"))
        page = client.get("/admin/reconcile/operatoraction/")
        self.assertNotContains(page, "<script>alert(1)</script>")
        self.assertContains(page, "&lt;script&gt;alert(1)&lt;/script&gt;")

    def test_acting_on_a_job_id_that_is_no_job_is_not_found(self) -> None:
        client = self.client_for(self.staff[0])
        for job_id in (uuid.uuid4(), "not-a-uuid", "../../user/1"):
            r = client.post(f"/admin/reconcile/job/{job_id}/act/",
                            {"action": "fail", "reason": "who is this"})
            self.assertEqual(r.status_code, 404, job_id)
        self.assertFalse(OperatorAction.objects.exists())

    def test_two_staff_failing_one_job_at_once_one_wins_with_one_record(self) -> None:
        job_id = self.accepted()
        both_checked = threading.Barrier(2, timeout=30)
        fail_job = lifecycle.fail_job

        def after_the_check(*args: Any, **kwargs: Any) -> bool:
            both_checked.wait()  # each passed operator.run's check before either writes
            return fail_job(*args, **kwargs)

        answers: dict[str, tuple[int, bool]] = {}

        def act(user: User) -> None:
            # no follow, no response.context: the test client's template capture is
            # process-wide, so two requests at once would read each other's
            try:
                r = self.client_for(user).post(f"/admin/reconcile/job/{job_id}/act/",
                                               {"action": "fail", "reason": f"{user} says"})
                answers[user.username] = (r.status_code, b"changed meanwhile" in r.content)
            finally:
                from django.db import connection

                connection.close()

        with mock.patch.object(lifecycle, "fail_job", after_the_check):
            threads = [threading.Thread(target=act, args=(user,)) for user in self.staff]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
        # the winner is sent back to the job's page; the other is told it changed meanwhile
        self.assertEqual(sorted(answers.values()), [(200, True), (302, False)], answers)
        self.assertEqual(self.row(job_id), ("failed", "accepted", 0))
        self.assertEqual(OperatorAction.objects.filter(job_id=job_id).count(), 1)
        self.assertEqual(self.balance(), 100)
        self.assertEqual(self.audit(), [])
