"""Internal: the Django admin of the library's tables, read-only.

Lists: every job, the jobs in flight, stuck, past their horizon, uncertain and unsettled (each
job with its events inline), balances, credit lots, ledger transactions, anomalies (open or
resolved) and the operator record. Nobody may add, change or delete a row here (the library's
lifecycle is the only writer of its rows). Which jobs a list holds is the library's own rule:
the operator reads of ``reconcile.ops.queries`` that the ``reconcile`` CLI and the console
list, never a copy of it.

Staff with ``reconcile.act_on_jobs`` get an "Act on this job" page: resolve an uncertain
submission with its upstream id or as not submitted, fail a job, retry a settlement. Each
action takes a typed reason and runs through :func:`reconcile.operator.run` (the same checks
and lifecycle functions as the CLI), recorded with the user's name in the operator record.
Viewing needs ``reconcile.view_job`` (jobs) or the table's own ``view_*`` permission.
"""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from ... import operator
from ...states import IN_FLIGHT, Status
from . import runtime
from .models import (
    CreditAnomaly,
    CreditBalance,
    CreditLot,
    CreditTransaction,
    InFlightJob,
    Job,
    JobEvent,
    OperatorAction,
    PastHorizonJob,
    StuckJob,
    UncertainJob,
    UnsettledJob,
)

ACT_PERMISSION = "reconcile.act_on_jobs"
VIEW_JOBS = "reconcile.view_job"
# the operator actions on a job's page, labelled as the console labels them
STAFF_ACTIONS = operator.JOB_ACTIONS
ACTION_LABELS = {name: operator.REGISTRY[name].label for name in STAFF_ACTIONS}
# the stuck, uncertain and unsettled lists show at most this many jobs (the library's listing)
LIST_LIMIT = 1000


def _uuid(term: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(term.strip())
    except ValueError:
        return None


def _job_link(job_id: uuid.UUID | None) -> Any:
    if job_id is None:
        return "-"
    return format_html('<a href="{}">{}</a>', reverse("admin:reconcile_job_change",
                                                      args=[job_id]), job_id)


class ReadOnly:
    """No add, change or delete for anyone (superusers included); no bulk actions."""

    actions = None

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ByIds(ReadOnly, admin.ModelAdmin):
    """Searchable by the uuids the table holds (``uuid_fields``)."""

    uuid_fields: tuple[str, ...] = ("user_id",)
    search_help_text = "a user or job id"

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        if not search_term.strip():
            return queryset, False
        value = _uuid(search_term)
        if value is None:
            return queryset.none(), False
        match = Q()
        for name in self.uuid_fields:
            match |= Q(**{name: value})
        return queryset.filter(match), False


class _Choices(admin.SimpleListFilter):
    """A filter whose choices are the library's own values, never a ``SELECT DISTINCT`` over
    the platform's whole ``jobs`` table (Django's default for a field)."""

    def values(self) -> list[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(value, value) for value in self.values()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{self.parameter_name: value}) if value else queryset


class StatusFilter(_Choices):
    title = "status"
    parameter_name = "status"

    def values(self) -> list[str]:
        return [str(s) for s in Status]


class KindFilter(_Choices):
    title = "provider kind"
    parameter_name = "provider_kind"

    def values(self) -> list[str]:
        from ...kinds import all_kinds

        return sorted(k.name for k in all_kinds())


class JobEventInline(ReadOnly, admin.TabularInline):
    model = JobEvent
    fields = readonly_fields = ("id", "created_at", "type", "payload", "published_at")
    extra = 0
    can_delete = False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.has_perm(VIEW_JOBS))


class ActForm(forms.Form):
    action = forms.ChoiceField(choices=[(a, ACTION_LABELS[a]) for a in STAFF_ACTIONS])
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                             max_length=operator.REASON_MAX,
                             help_text="Why: kept in the operator record, never shown to the "
                                       "customer.")
    upstream_id = forms.CharField(required=False, max_length=500,
                                  help_text="The provider's task id (resolve with upstream id "
                                            "only).")


class JobAdmin(ByIds):
    """Every job (the platform's ``jobs`` rows, with the library's columns)."""

    list_display: tuple[str, ...] = ("id", "user_id", "status", "submission_state",
                                     "provider_kind", "provider_model", "created_at", "error_code")
    list_filter = (StatusFilter, KindFilter)
    search_help_text = "a job id, a user id or an upstream task id"
    inlines = (JobEventInline,)
    change_form_template = "reconcile/admin/job_change_form.html"
    show_full_result_count = False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.has_perm(VIEW_JOBS))

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        value = _uuid(term)
        if value is None:
            return queryset.filter(provider_task_id=term), False
        return queryset.filter(Q(id=value) | Q(user_id=value)), False

    def get_urls(self) -> list[Any]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_act"
        return [path("<path:object_id>/act/", self.admin_site.admin_view(self.act_view),
                     name=name), *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra = dict(extra_context or {})
        if request.user.has_perm(ACT_PERMISSION) and _uuid(object_id) is not None:
            extra["reconcile_act_url"] = reverse("admin:reconcile_job_act", args=[object_id])
        return super().change_view(request, object_id, form_url, extra)

    def act_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The operator actions on one job: a form with the action, the reason and (to resolve
        with one) the upstream id; ``reconcile.operator.run`` does it or says why not."""
        if not request.user.has_perm(ACT_PERMISSION):
            raise PermissionDenied
        job_id = _uuid(object_id)
        job = Job.objects.filter(pk=job_id).first() if job_id is not None else None
        if job_id is None or job is None:
            raise Http404(f"no job {object_id}")
        rt = runtime()
        form = ActForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            who = operator.Operator(identity=request.user.get_username(), via="django-admin")
            try:
                done = operator.run(rt, form.cleaned_data["action"], job_id, operator=who,
                                    reason=form.cleaned_data["reason"],
                                    upstream_id=form.cleaned_data["upstream_id"] or None)
            except (operator.ActionRefused, operator.ActionLost) as exc:
                messages.error(request, str(exc))
            else:
                (messages.success if done.changed else messages.info)(request, done.message)
                return HttpResponseRedirect(reverse("admin:reconcile_job_change", args=[job_id]))
        now = rt.now()
        choices = [(ACTION_LABELS[a], operator.refusal(rt, a, job_id, now=now))
                   for a in STAFF_ACTIONS]
        context = {
            **self.admin_site.each_context(request), "opts": Job._meta, "job": job,
            "form": form, "choices": choices, "title": f"Act on job {job_id}",
            "job_url": reverse("admin:reconcile_job_change", args=[job_id]),
        }
        return TemplateResponse(request, "reconcile/admin/act.html", context)


class InFlightJobAdmin(JobAdmin):
    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # the columns and states of jobstore.in_flight() (status IN states.IN_FLIGHT); not ids:
        # a busy platform has more jobs in flight than an id list should carry
        return super().get_queryset(request).filter(status__in=list(IN_FLIGHT))


class _Listed(JobAdmin):
    """A list whose jobs are the ids the library's listing returns (at most LIST_LIMIT)."""

    def listed(self, rt: Any, session: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        rt = runtime()
        with rt.sessions() as session:
            ids = [row["id"] for row in self.listed(rt, session)]
        return super().get_queryset(request).filter(pk__in=ids)


class StuckJobAdmin(_Listed):
    def listed(self, rt: Any, session: Any) -> list[dict[str, Any]]:
        from ...ops import queries

        return queries.stuck(rt, session, now=rt.now(), limit=LIST_LIMIT).rows


class PastHorizonJobAdmin(_Listed):
    def listed(self, rt: Any, session: Any) -> list[dict[str, Any]]:
        from ...ops import queries

        return queries.past_horizon(rt, session, now=rt.now(), limit=LIST_LIMIT).rows


class UncertainJobAdmin(_Listed):
    def listed(self, rt: Any, session: Any) -> list[dict[str, Any]]:
        from ...ops import queries

        return queries.uncertain(rt, session, now=rt.now(), limit=LIST_LIMIT).rows


class UnsettledJobAdmin(_Listed):
    list_display = ("id", "user_id", "status", "error_code", "completed_at", "next_poll_at",
                    "settle_attempts")

    def listed(self, rt: Any, session: Any) -> list[dict[str, Any]]:
        from ...ops import queries

        return queries.unsettled(rt, session, now=rt.now(), limit=LIST_LIMIT).rows


class CreditBalanceAdmin(ByIds):
    list_display = ("user_id", "sub", "topup", "updated_at")


class CreditLotAdmin(ByIds):
    list_display = ("id", "user_id", "pool", "kind", "amount", "remaining_amount",
                    "source_txn_id", "created_at")
    list_filter = ("pool", "kind")


class CreditTransactionAdmin(ByIds):
    list_display = ("id", "user_id", "job", "type", "amount", "from_sub", "from_topup",
                    "created_at")
    list_filter = ("type",)
    uuid_fields = ("user_id", "job_id")

    def job(self, obj: CreditTransaction) -> Any:
        return _job_link(obj.job_id)

    job.short_description = "job"  # type: ignore[attr-defined]


class OpenFilter(admin.SimpleListFilter):
    """Open anomalies (no operator action answered them yet) or resolved ones."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("open", "open"), ("resolved", "resolved")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() in ("open", "resolved"):
            return queryset.filter(resolved_at__isnull=self.value() == "open")
        return queryset


class CreditAnomalyAdmin(ByIds):
    list_display = ("id", "kind", "job", "user_id", "created_at", "resolved_at", "resolved_by",
                    "resolved_action", "detail")
    list_filter = (OpenFilter, "kind")
    uuid_fields = ("user_id", "job_id")

    def job(self, obj: CreditAnomaly) -> Any:
        return _job_link(obj.job_id)

    job.short_description = "job"  # type: ignore[attr-defined]


class OperatorActionAdmin(ByIds):
    list_display = ("created_at", "operator", "via", "action", "job", "reason")
    list_filter = ("action", "via")
    uuid_fields = ("user_id", "job_id")

    def job(self, obj: OperatorAction) -> Any:
        return _job_link(obj.job_id)

    job.short_description = "job"  # type: ignore[attr-defined]


admin.site.register(Job, JobAdmin)
admin.site.register(InFlightJob, InFlightJobAdmin)
admin.site.register(StuckJob, StuckJobAdmin)
admin.site.register(PastHorizonJob, PastHorizonJobAdmin)
admin.site.register(UncertainJob, UncertainJobAdmin)
admin.site.register(UnsettledJob, UnsettledJobAdmin)
admin.site.register(CreditBalance, CreditBalanceAdmin)
admin.site.register(CreditLot, CreditLotAdmin)
admin.site.register(CreditTransaction, CreditTransactionAdmin)
admin.site.register(CreditAnomaly, CreditAnomalyAdmin)
admin.site.register(OperatorAction, OperatorActionAdmin)
