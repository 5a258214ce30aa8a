"""The platform's Celery app, configured from the Django settings, with the library installed.

    celery -A django_platform worker -Q celery,reconcile,reconcile.sweep
    celery -A django_platform beat
"""

import os

import django
from celery import Celery

import reconcile

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_platform.settings")
# the apps' ready(): reconcile.contrib.django passes the RECONCILE dict and the database to the
# library's settings before reconcile.install reads them
django.setup()

app = Celery("django_platform")
app.config_from_object("django.conf:settings", namespace="CELERY")
reconcile.install(app)
app.autodiscover_tasks()
