"""The platform's own tables, shaped by the library's table contract (README: The table
contract): a uuid ``jobs.id`` and uuid user ids; ``usage_logs.id`` is Django's default
``BigAutoField`` (the database assigns it). The library adds its own columns to these tables
(``manage.py migrate`` runs its migrations); the platform treats those as read-only and saves
its own columns with ``save(update_fields=[...])``."""

import uuid

from django.db import models
from django.utils import timezone


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user_id = models.UUIDField(db_index=True)
    job_type = models.CharField(max_length=100)
    status = models.CharField(max_length=32, db_index=True)
    input_data = models.JSONField(default=dict)
    output_data = models.JSONField(null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    provider = models.CharField(max_length=100, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "jobs"


class UsageLog(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, db_column="job_id",
                            related_name="usage_logs")
    user_id = models.UUIDField(db_index=True)
    status = models.CharField(max_length=32)
    credits = models.BigIntegerField()
    metadata = models.JSONField(default=dict)

    class Meta:
        db_table = "usage_logs"
