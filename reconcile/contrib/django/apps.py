"""Internal: the Django app: ``INSTALLED_APPS = [..., "reconcile.contrib.django"]`` (label ``reconcile``)."""

from __future__ import annotations

from django.apps import AppConfig


class ReconcileConfig(AppConfig):
    name = "reconcile.contrib.django"
    label = "reconcile"
    verbose_name = "reconcile"

    def ready(self) -> None:
        # the RECONCILE dict and the database reach every part of the library that reads its
        # settings in this process: the Celery settings, the workers' runtime, the start-up checks
        from . import export_environment

        export_environment()
        from django.apps import apps

        if apps.is_installed("django_celery_beat"):
            from celery.signals import beat_init

            from .beat import keep_expires

            # django-celery-beat's DatabaseScheduler would drop the library's entries' expires
            beat_init.connect(keep_expires, weak=False, dispatch_uid="reconcile.django.beat")
