"""The library's admin in the platform's own tests: the uncertain list holds a submission whose
create was lost, and staff with ``reconcile.act_on_jobs`` resolve it from the admin."""

import uuid

from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.test import TransactionTestCase, override_settings

from reconcile import credits, operator
from reconcile.contrib.django import runtime
from reconcile.contrib.django.testing import flush, simulated
from reconcile.testing.simulator import Script

from .models import Job

# the provider accepts the create, then the connection drops before its answer: uncertain
LOST = Script(create="drop_after_accept", timeline=((0.0, "queued"), (0.1, "succeeded")))


@override_settings(RECONCILE={**settings.RECONCILE, "eager": True, "time_scale": 0.02})
class AdminActions(TransactionTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.sim = cls.enterClassContext(simulated())

    def setUp(self) -> None:
        self.sim.reset()
        self.sim.script_model("lost", LOST)
        perms = Permission.objects.filter(content_type__app_label="reconcile")
        self.staff = User.objects.create_user("ann", is_staff=True)
        self.staff.user_permissions.add(*perms)
        self.viewer = User.objects.create_user("bob", is_staff=True)
        self.viewer.user_permissions.add(*perms.exclude(codename="act_on_jobs"))
        self.client.force_login(self.staff)
        self.user = uuid.uuid4()
        with runtime().sessions.begin() as session:
            credits.grant(session, self.user, "sub", 50, f"test-grant:{uuid.uuid4()}")

    def tearDown(self) -> None:
        flush()

    def lost_job(self) -> str:
        r = self.client.post("/api/v1/jobs", {"model": "lost"}, content_type="application/json",
                             headers={"X-User-Id": str(self.user)})
        self.assertEqual(r.status_code, 202, r.json())
        job_id = r.json()["job_id"]
        self.assertEqual(Job.objects.get(pk=job_id).status, "pending")
        return job_id

    def act(self, job_id: str, **form: str):
        return self.client.post(f"/admin/reconcile/job/{job_id}/act/", form, follow=True)

    def test_an_uncertain_submission_is_listed_and_resolved_with_its_upstream_id(self) -> None:
        job_id = self.lost_job()
        self.assertContains(self.client.get("/admin/reconcile/uncertainjob/"), job_id)
        self.assertContains(self.client.get("/admin/reconcile/inflightjob/"), job_id)
        self.assertNotContains(self.client.get("/admin/reconcile/unsettledjob/"), job_id)
        page = self.client.get(f"/admin/reconcile/job/{job_id}/act/")
        self.assertContains(page, "Resolve: the provider created it — adopt this upstream id</strong>: "
                                  "allowed")
        (task_id,) = self.sim.tasks
        # a staff user without reconcile.act_on_jobs is refused
        self.client.force_login(self.viewer)
        self.assertEqual(self.client.post(f"/admin/reconcile/job/{job_id}/act/", {
            "action": "resolve_upstream", "reason": "x", "upstream_id": task_id}).status_code, 403)
        self.client.force_login(self.staff)
        # the upstream id is required for this action: the operator module says so
        r = self.act(job_id, action="resolve_upstream", reason="seen in the KIE console")
        self.assertEqual([str(m) for m in r.context["messages"]], ["give the upstream id to adopt"])
        r = self.act(job_id, action="resolve_upstream", reason="seen in the KIE console",
                     upstream_id=task_id)
        self.assertEqual([str(m) for m in r.context["messages"]], [
            f"job {job_id} adopted upstream id {task_id}: processing, polling resumed"])
        # eager: the poll the adoption resumed ran in the request
        self.assertEqual(Job.objects.get(pk=job_id).status, "completed")
        self.assertNotContains(self.client.get("/admin/reconcile/uncertainjob/"), job_id)
        record = self.client.get("/admin/reconcile/operatoraction/")
        self.assertContains(record, "seen in the KIE console")
        with runtime().sessions() as session:
            (action,) = operator.records(session, job_id=uuid.UUID(job_id))
        self.assertEqual(
            (action["operator"], action["via"], action["action"], action["reason"],
             action["detail"]),
            ("ann", "django-admin", "resolve_upstream", "seen in the KIE console",
             {"upstream_id": task_id}))

    def test_an_uncertain_submission_resolved_as_not_submitted_is_refunded(self) -> None:
        job_id = self.lost_job()
        r = self.act(job_id, action="resolve_not_submitted",
                     reason="KIE support: no such task")
        self.assertEqual([str(m) for m in r.context["messages"]],
                         [f"job {job_id} failed as not submitted"])
        self.assertEqual(Job.objects.get(pk=job_id).status, "failed")
        with runtime().sessions.begin() as session:
            self.assertEqual(credits.lock_balance(session, self.user).sub, 50)
        # nothing left to resolve: refused, with the operator module's reason
        r = self.act(job_id, action="resolve_not_submitted", reason="again")
        self.assertEqual([str(m) for m in r.context["messages"]], [
            f"job {job_id} is failed/rejected: only uncertain submissions are resolved"])
