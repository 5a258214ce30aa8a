"""Internal: the library's tables as unmanaged Django models, for the read-only admin.

``managed = False``: Django's migrations never create, alter or drop these tables (the library's
own revisions do, ``migrations/0001_library.py``), and ``manage.py flush`` leaves them alone.
:class:`Job` reads the platform's ``jobs`` table under its own name in this app (label
``reconcile``), so it never clashes with the platform's own ``Job`` model; it maps only the
columns the table contract guarantees (``reconcile.db.contract``: the platform's required ones
and the library's own). The proxies are the operator lists (in flight, stuck, past their
horizon, uncertain, unsettled); which rows each holds is the library's own query (``admin.py``).

Permissions: ``reconcile.view_job`` lets staff read every job list; the other tables have their
own ``view_*``. ``reconcile.act_on_jobs`` lets a user run the operator actions
(``reconcile.operator``) from the admin. There are no add/change/delete permissions.
"""

from __future__ import annotations

from django.db import models

VIEW_ONLY = ("view",)


class Job(models.Model):
    """A row of ``jobs``, as the library sees it."""

    id = models.UUIDField(primary_key=True)
    user_id = models.UUIDField()
    job_type = models.TextField()
    status = models.TextField()
    error_message = models.TextField(null=True)
    created_at = models.DateTimeField(null=True)
    started_at = models.DateTimeField(null=True)
    completed_at = models.DateTimeField(null=True)
    provider_kind = models.TextField(null=True)
    provider_model = models.TextField(null=True)
    provider_task_id = models.TextField(null=True)
    provider_call_started_at = models.DateTimeField(null=True)
    submission_state = models.TextField(null=True)
    claim_expires_at = models.DateTimeField(null=True)
    reconcile_attempts = models.IntegerField(null=True)
    reconcile_last_error = models.TextField(null=True)
    reconcile_last_error_code = models.TextField(null=True)
    reconcile_last_attempt_at = models.DateTimeField(null=True)
    error_code = models.TextField(null=True)
    error_detail = models.JSONField(null=True)
    credits_actual = models.BigIntegerField(null=True)
    next_poll_at = models.DateTimeField(null=True)
    settle_attempts = models.IntegerField(null=True)

    class Meta:
        managed = False
        db_table = "jobs"
        ordering = ("-created_at",)
        default_permissions = VIEW_ONLY
        permissions = [("act_on_jobs",
                        "Can act on jobs by hand (resolve, fail, retry a settlement)")]

    def __str__(self) -> str:
        return str(self.id)


class InFlightJob(Job):
    class Meta:
        proxy = True
        default_permissions = ()
        verbose_name = "job in flight"
        verbose_name_plural = "jobs in flight"


class StuckJob(Job):
    class Meta:
        proxy = True
        default_permissions = ()
        verbose_name = "stuck job"


class PastHorizonJob(Job):
    class Meta:
        proxy = True
        default_permissions = ()
        verbose_name = "job past its horizon"
        verbose_name_plural = "jobs past their horizon"


class UncertainJob(Job):
    class Meta:
        proxy = True
        default_permissions = ()
        verbose_name = "uncertain submission"


class UnsettledJob(Job):
    class Meta:
        proxy = True
        default_permissions = ()
        verbose_name = "unsettled refund"


class JobEvent(models.Model):
    """``reconcile_job_events``: the customer's stream of a job's state changes."""

    id = models.BigIntegerField(primary_key=True)
    event_id = models.TextField()
    job = models.ForeignKey(Job, models.DO_NOTHING, db_column="job_id", db_constraint=False,
                            related_name="events")
    user_id = models.UUIDField()
    type = models.TextField()
    payload = models.JSONField(null=True)
    created_at = models.DateTimeField()
    published_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = "reconcile_job_events"
        ordering = ("id",)
        default_permissions = VIEW_ONLY


class CreditBalance(models.Model):
    user_id = models.UUIDField(primary_key=True)
    sub = models.BigIntegerField()
    topup = models.BigIntegerField()
    updated_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "reconcile_credit_balances"
        ordering = ("-updated_at",)
        default_permissions = VIEW_ONLY


class CreditLot(models.Model):
    id = models.BigIntegerField(primary_key=True)
    user_id = models.UUIDField()
    pool = models.TextField()
    kind = models.TextField()
    source_txn_id = models.TextField()
    amount = models.BigIntegerField()
    remaining_amount = models.BigIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "reconcile_credit_lots"
        ordering = ("-id",)
        default_permissions = VIEW_ONLY


class CreditTransaction(models.Model):
    id = models.TextField(primary_key=True)
    user_id = models.UUIDField()
    job_id = models.UUIDField(null=True)
    type = models.TextField()
    amount = models.BigIntegerField()
    from_sub = models.BigIntegerField()
    from_topup = models.BigIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        managed = False
        db_table = "reconcile_credit_transactions"
        ordering = ("-created_at", "id")
        default_permissions = VIEW_ONLY


class CreditAnomaly(models.Model):
    id = models.BigIntegerField(primary_key=True)
    job_id = models.UUIDField(null=True)
    user_id = models.UUIDField(null=True)
    kind = models.TextField()
    detail = models.JSONField(null=True)
    created_at = models.DateTimeField()
    # closed by the operator action that answers it (reconcile.operator): when, who, which
    resolved_at = models.DateTimeField(null=True)
    resolved_by = models.TextField(null=True)
    resolved_action = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = "reconcile_credit_anomalies"
        ordering = ("-id",)
        default_permissions = VIEW_ONLY
        verbose_name_plural = "credit anomalies"


class OperatorAction(models.Model):
    """``reconcile_operator_actions``: who did what to which job by hand, through which
    surface, and why. Staff only: customers never read it."""

    id = models.BigIntegerField(primary_key=True)
    created_at = models.DateTimeField()
    operator = models.TextField()
    via = models.TextField()
    action = models.TextField()
    job_id = models.UUIDField(null=True)
    user_id = models.UUIDField(null=True)
    reason = models.TextField()
    detail = models.JSONField(null=True)

    class Meta:
        managed = False
        db_table = "reconcile_operator_actions"
        ordering = ("-id",)
        default_permissions = VIEW_ONLY
        verbose_name = "operator action"
