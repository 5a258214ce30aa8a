"""Settings of the example Django platform. The environment fills in the deployment's values:
``PLATFORM_DATABASE_URL`` (PostgreSQL), ``CELERY_BROKER_URL``, ``PLATFORM_MEDIA_URL``; the
providers' base URLs and keys come from ``RECONCILE_*`` variables (README, Configuration)."""

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_beat",  # beat's schedule in the database (CELERY_BEAT_SCHEDULER below)
    "platform_app",
    "reconcile.contrib.django",  # the library: its migrations, its admin, manage.py reconcile
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "django_platform.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
STATIC_URL = "static/"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_db = urlsplit(os.environ.get("PLATFORM_DATABASE_URL",
                              "postgresql://postgres@127.0.0.1:5432/django_platform"))
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.path.lstrip("/"),
        "USER": unquote(_db.username or ""),
        "PASSWORD": unquote(_db.password or ""),
        "HOST": _db.hostname or "",
        "PORT": _db.port or "",
    } if _db.scheme.startswith("postgres") else {
        # sqlite:///path/to/file.db: a development database
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _db.path[1:],  # sqlite:///dev.db is relative, sqlite:////srv/dev.db absolute
        # the library opens its own connection: a test database must be a file, not :memory:
        "TEST": {"NAME": _db.path[1:] + ".test"},
    }
}
# manage.py test: the library's connections are closed before the test database is dropped
TEST_RUNNER = "reconcile.contrib.django.testing.ReconcileTestRunner"

# Celery, configured from these settings (django_platform/celery.py)
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_TASK_IGNORE_RESULT = True
# `celery -A django_platform beat` keeps its schedule in PeriodicTask rows (the library's sweep
# entry among them, with its expiry: reconcile.contrib.django)
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"

# the library: one dict; the database is DATABASES["default"]
RECONCILE = {
    "jobs_app": "platform",  # its first migration creates jobs and usage_logs
    "broker_url": CELERY_BROKER_URL,
    "storage_url": os.environ.get("PLATFORM_MEDIA_URL", f"file://{BASE_DIR / 'media'}"),
}
