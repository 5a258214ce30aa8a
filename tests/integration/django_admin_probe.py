"""Run in a ``manage.py shell`` of the example Django platform (tests/integration/
test_django_platform.py): the library's admin through Django's test client, as two staff
users — one with ``reconcile.act_on_jobs``, one without — on the job ``PROBE_JOB`` of the
customer ``PROBE_USER``. Prints one ``ANSWER {json}`` line with what it saw."""

import json
import os
import re
import uuid

from django.contrib.auth.models import Permission, User
from django.test import Client

from reconcile import api
from reconcile.contrib.django import runtime

job, customer = os.environ["PROBE_JOB"], uuid.UUID(os.environ["PROBE_USER"])
reason = os.environ["PROBE_REASON"]
perms = Permission.objects.filter(content_type__app_label="reconcile")
staff = User.objects.create_user("ops-ann", password=None, is_staff=True)
staff.user_permissions.add(*perms)
viewer = User.objects.create_user("ops-bob", password=None, is_staff=True)
viewer.user_permissions.add(*perms.exclude(codename="act_on_jobs"))
outsider = User.objects.create_user("ops-cy", password=None, is_staff=True)  # no permission
ann, bob, cy = Client(), Client(), Client()
ann.force_login(staff)
bob.force_login(viewer)
cy.force_login(outsider)
act_url = f"/admin/reconcile/job/{job}/act/"


def text(response) -> str:
    return response.content.decode()


out: dict = {"pages": {}}
for name in ("job", "inflightjob", "stuckjob", "pasthorizonjob", "uncertainjob", "unsettledjob",
             "creditbalance", "creditlot", "credittransaction", "creditanomaly",
             "creditanomaly/?state=open", "operatoraction"):
    r = ann.get(f"/admin/reconcile/{name}/")
    out["pages"][name] = [r.status_code, job in text(r)]
out["filters"] = [job in text(ann.get(f"/admin/reconcile/job/?status={status}&provider_kind=kie-standard"))
                  for status in ("processing", "completed")]
out["search"] = [job in text(ann.get(f"/admin/reconcile/job/?q={term}"))
                 for term in (job, str(customer), "not-a-task-id")]
out["index_lists_reconcile"] = "/admin/reconcile/stuckjob/" in text(ann.get("/admin/"))
out["outsider"] = [cy.get("/admin/reconcile/job/").status_code, cy.get(act_url).status_code]
page = text(ann.get(f"/admin/reconcile/job/{job}/change/"))
out["change"] = {"act_link": "Act on this job" in page,
                 "events": re.findall(r'<td class="field-type">\s*<p>(\w+)</p>', page),
                 "read_only": 'name="_save"' not in page}
out["viewer"] = {
    "act_link": "Act on this job" in text(bob.get(f"/admin/reconcile/job/{job}/change/")),
    "get": bob.get(act_url).status_code,
    "post": bob.post(act_url, {"action": "fail", "reason": "not mine to do"}).status_code,
}
act_page = text(ann.get(act_url))
out["act_page"] = re.findall(r"<li><strong>(.*?)</strong>: (allowed|refused)", act_page)
out["blank_reason"] = re.findall(r'<ul class="errorlist"[^>]*><li>(.*?)</li>',
                                 text(ann.post(act_url, {"action": "fail", "reason": " "})))
r = ann.post(act_url, {"action": "fail", "reason": reason})
out["act"] = [r.status_code, r.get("Location")]
out["messages"] = re.findall(r'<li class="(success|error|info)">(.*?)</li>',
                             text(ann.get(r["Location"])))
again = text(ann.post(act_url, {"action": "retry_settle", "reason": "once more"}))
out["refused"] = re.findall(r'<li class="error">(.*?)</li>', again)
out["operator_log_page"] = reason in text(ann.get("/admin/reconcile/operatoraction/"))
rt = runtime()
status, snapshot = api.snapshot(rt, customer, uuid.UUID(job))
out["snapshot"] = [status, snapshot]
out["customer_events"] = api.events_after(rt, customer, uuid.UUID(job), 0)[0]
print("ANSWER " + json.dumps(out, default=str))
