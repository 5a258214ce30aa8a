"""``reconcile.contrib.django``: the library in a Django project (``pip install 'reconcile[django]'``).

Add ``"reconcile.contrib.django"`` to ``INSTALLED_APPS`` (app label ``reconcile``) and configure
it with one dict in the Django settings::

    RECONCILE = {
        "jobs_app": "platform",          # the app whose migrations create jobs / usage_logs
        "database_alias": "default",     # DATABASES entry the library uses (default "default")
        "broker_url": CELERY_BROKER_URL,
        "storage_url": "file:///srv/media",
        # ... any other reconcile.settings.Settings field, by its lower-case name
    }

The database is ``DATABASES[database_alias]`` (PostgreSQL, or SQLite for development), never a
second URL; the broker, where neither the dict nor ``RECONCILE_BROKER_URL`` names one, is
Django's ``CELERY_BROKER_URL``. :func:`settings` builds the library's :class:`~reconcile.settings.Settings` from
both (``RECONCILE_*`` environment variables fill the fields the dict does not name); the app's
``ready()`` exports them as ``RECONCILE_*`` variables (:func:`export_environment`), so the parts
of the library that read the environment — the Celery settings ``reconcile.install`` merges,
the workers' runtime, the start-up checks, ``manage.py reconcile`` — see the same values.
``manage.py migrate`` runs the library's own migrations (``migrations/0001_library.py``).

Also here: the read-only admin of the library's tables with the operator actions for staff with
``reconcile.act_on_jobs`` (``admin.py``); creates that wait for the platform's commit and an
eager mode for tests (``enqueue.py``, ``RECONCILE["eager"]``); the sweep's expiry kept under
django-celery-beat (``beat.py``); the test helpers (:mod:`reconcile.contrib.django.testing`).
"""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ...runtime import Runtime
from ...settings import Settings

__all__ = [
    "close_connections", "database_alias", "database_url", "eager", "export_environment",
    "jobs_migration", "runtime", "runtime_options", "settings", "url_for",
]

# keys of the RECONCILE dict that are the integration's own, not library settings
_OWN_KEYS = ("database_alias", "eager", "jobs_app", "runtime_options")
# libpq connection parameters passed on from DATABASES[...]["OPTIONS"]; Django-only options
# (pool, isolation_level, server_side_binding, assume_role) do not apply to the library's engine
_LIBPQ_OPTIONS = frozenset({
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "options", "application_name",
    "connect_timeout", "target_session_attrs", "service", "passfile", "keepalives",
    "keepalives_idle", "keepalives_interval", "keepalives_count", "channel_binding",
})
_POSTGRES_ENGINES = ("django.db.backends.postgresql", "django.contrib.gis.db.backends.postgis")
_SQLITE_ENGINES = ("django.db.backends.sqlite3", "django.contrib.gis.db.backends.spatialite")


def _config() -> dict[str, Any]:
    from django.conf import settings as django_settings

    config = getattr(django_settings, "RECONCILE", None) or {}
    if not isinstance(config, dict):
        raise ImproperlyConfigured(f"RECONCILE must be a dict, not {type(config).__name__}")
    return {str(key).lower(): value for key, value in config.items()}


def database_alias() -> str:
    return str(_config().get("database_alias", "default"))


def jobs_migration() -> tuple[str, str] | None:
    """The migration the library's depends on: ``RECONCILE["jobs_app"]`` — an app label (its
    first migration, which must create ``jobs`` and ``usage_logs``) or ``(label, migration)``."""
    app = _config().get("jobs_app")
    if not app:
        return None
    if isinstance(app, str):
        return (app, "__first__")
    label, name = app
    return (str(label), str(name))


def url_for(settings_dict: dict[str, Any]) -> str:
    """The SQLAlchemy URL of a Django connection's ``settings_dict`` (PostgreSQL or SQLite)."""
    from sqlalchemy.engine import URL

    engine = settings_dict.get("ENGINE", "")
    name = settings_dict.get("NAME")
    if engine in _POSTGRES_ENGINES:
        options = settings_dict.get("OPTIONS") or {}
        query = {key: str(value) for key, value in options.items() if key in _LIBPQ_OPTIONS}
        port = settings_dict.get("PORT")
        return URL.create(
            "postgresql+psycopg", username=settings_dict.get("USER") or None,
            password=settings_dict.get("PASSWORD") or None, host=settings_dict.get("HOST") or None,
            port=int(port) if port else None, database=name or None, query=query,
        ).render_as_string(hide_password=False)
    if engine in _SQLITE_ENGINES:
        text = str(name or "")
        if not text or text == ":memory:" or "mode=memory" in text:
            raise ImproperlyConfigured(
                "reconcile needs an SQLite file (the library opens its own connection, which an "
                f"in-memory database does not share): NAME is {text!r}; for tests set "
                "DATABASES[...]['TEST']['NAME'] to a file")
        return f"sqlite:///{Path(text).resolve()}"
    raise ImproperlyConfigured(
        f"reconcile supports PostgreSQL and SQLite, not the database engine {engine!r}")


def database_url(alias: str | None = None) -> str:
    """The URL of ``DATABASES[alias]`` (default: ``RECONCILE["database_alias"]``) as the
    connection sees it (under Django's test runner: the test database)."""
    from django.db import connections
    from django.utils.connection import ConnectionDoesNotExist

    alias = alias or database_alias()
    try:
        settings_dict = connections[alias].settings_dict
    except ConnectionDoesNotExist:
        raise ImproperlyConfigured(f"RECONCILE['database_alias'] = {alias!r}: no such "
                                   "entry in DATABASES") from None
    return url_for(settings_dict)


def _library_values() -> dict[str, Any]:
    values = {key: value for key, value in _config().items() if key not in _OWN_KEYS}
    if "database_url" in values:
        raise ImproperlyConfigured(
            "RECONCILE['database_url']: the database is DATABASES[RECONCILE['database_alias']]; "
            "remove database_url")
    unknown = sorted(set(values) - set(Settings.with_families().model_fields))
    if unknown:
        raise ImproperlyConfigured(
            f"RECONCILE: unknown setting(s) {', '.join(unknown)} (the keys are the fields of "
            f"reconcile.settings.Settings, or {', '.join(_OWN_KEYS)})")
    if eager():
        # the eager run steps the poll chain inline, in the request: batch mode (the default)
        # has no poll message to run, and its claims come from the workers' poll_due ticks
        if values.get("poll_mode", "chain") != "chain":
            raise ImproperlyConfigured("RECONCILE['eager'] runs the poll chain in the request: "
                                       "leave poll_mode out (eager polls as 'chain') or set it "
                                       "to 'chain'")
        values["poll_mode"] = "chain"
    if "broker_url" not in values and not os.environ.get("RECONCILE_BROKER_URL"):
        # the workers' broker: a process that sends through the library's own Celery app (a
        # web process that never imports the project's) must not fall back to filesystem://
        from django.conf import settings as django_settings

        celery = getattr(django_settings, "CELERY_BROKER_URL", None)
        if celery:
            values["broker_url"] = celery
    return values


def settings() -> Settings:
    """The library's settings: the RECONCILE dict, the database from ``DATABASES``, and
    ``RECONCILE_*`` environment variables for the fields the dict leaves out."""
    from pydantic import ValidationError

    values = _library_values()
    try:
        return Settings(**values, database_url=database_url())
    except ValidationError as exc:
        # a refused field the dict leaves out came from the environment: say which
        from_env = sorted({Settings.env_name(str(e["loc"][0])) for e in exc.errors()
                           if e["loc"] and e["loc"][0] not in values
                           and e["loc"][0] != "database_url"})
        where = f" (from the environment: {', '.join(from_env)})" if from_env else ""
        raise ImproperlyConfigured(f"RECONCILE{where}: {exc}") from exc


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | Decimal | Fraction | float):
        return str(value)
    if isinstance(value, timedelta):
        return str(value.total_seconds())
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list | tuple | set | frozenset | dict):
        return json.dumps(value if isinstance(value, dict) else list(value))
    raise ImproperlyConfigured(f"RECONCILE: cannot pass {value!r} to the library's processes")


def export_environment() -> Settings:
    """Write :func:`settings` (the dict's keys and ``database_url``) into ``os.environ`` as
    ``RECONCILE_*``, check that the environment now reads back as the same settings, and
    return them. Called by the app's ``ready()``."""
    wanted = settings()
    values = {**_library_values(), "database_url": wanted.database_url}
    for key, value in values.items():
        name = Settings.env_name(key)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = _env_text(value)
    from pydantic import ValidationError

    try:
        same = Settings() == wanted
    except ValidationError as exc:  # a value the environment's text cannot carry (1/10 for a float)
        named = ", ".join(sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]}))
        raise ImproperlyConfigured(f"RECONCILE: {named or 'a setting'} does not read back from "
                                   "the environment the workers use; give a plain value (a "
                                   "number, a string, True or False where the setting takes "
                                   "one)") from None
    if not same:
        raise ImproperlyConfigured("RECONCILE: the settings do not read back the same from the "
                                   "environment the workers use; give plain values")
    return wanted


def eager() -> bool:
    """``RECONCILE["eager"]``: run a job's create and polls inline, in the request (in chain
    mode, whatever ``RECONCILE_POLL_MODE`` says), against the
    simulator (tests only; read at each enqueue, so ``override_settings`` applies)."""
    value = _config().get("eager", False)
    if not isinstance(value, bool):
        raise ImproperlyConfigured(f"RECONCILE['eager'] must be True or False, not {value!r}")
    return value


def runtime_options() -> dict[str, Any]:
    """The platform's keyword arguments for the library's :class:`~reconcile.runtime.Runtime`
    (its hooks: ``pricing_hook``, ``watermark_hook``, ``completion_hooks``, ``event_hooks``, …):
    ``RECONCILE["runtime_options"]`` names a function (``"platform_app.billing.options"``) that
    returns them; none without it."""
    from django.utils.module_loading import import_string

    path = _config().get("runtime_options")
    if not path:
        return {}
    if not isinstance(path, str):
        raise ImproperlyConfigured("RECONCILE['runtime_options'] names a function by its dotted "
                                   f"path, not {path!r}")
    try:
        options = import_string(path)()
    except ImportError as exc:
        raise ImproperlyConfigured(f"RECONCILE['runtime_options']: {exc}") from exc
    if not isinstance(options, dict):
        raise ImproperlyConfigured(f"RECONCILE['runtime_options']: {path}() must return a dict "
                                   "of Runtime keyword arguments")
    return options


_runtimes: dict[tuple[Any, ...], Runtime] = {}
_lock = threading.Lock()


def _configuration() -> tuple[Any, ...]:
    """What a runtime is built from, as it is now: the connection's database, the RECONCILE dict
    and the ``RECONCILE_*`` environment (the database's own variable aside: a runtime writes it)."""
    environment = tuple(sorted((k, v) for k, v in os.environ.items()
                               if k.startswith("RECONCILE_") and k != "RECONCILE_DATABASE_URL"))
    return database_url(), repr(sorted(_config().items())), environment


def runtime() -> Runtime:
    """This process's :class:`~reconcile.runtime.Runtime` from :func:`settings`, shared with
    the library's tasks, so the view's submit enqueues through the installed Celery app.

    The database is resolved at each call from the connection's settings as they are then, so
    under Django's test runner (which renames the database after ``ready()``) the library
    reads and writes the test database; likewise a test's ``override_settings(RECONCILE=...)``
    or ``RECONCILE_*`` variables apply from the next call. One runtime is built per process and
    configuration (the table contract is checked then), with the platform's hooks
    (:func:`runtime_options`); call it in the workers' ``worker_process_init`` so the library's
    tasks there run with them too. Its creates wait for the platform's commit
    (``transaction.on_commit``) and run inline with ``RECONCILE["eager"]``
    (:mod:`reconcile.contrib.django.enqueue`)."""
    from ... import tasks
    from .enqueue import wire

    configuration = _configuration()
    key = (os.getpid(), *configuration)
    with _lock:
        rt = _runtimes.get(key)
        if rt is None:
            rt = Runtime.from_settings(settings(), **runtime_options())
            tasks.set_runtime(rt)  # the Celery sends; wire() wraps them
            wire(rt, database_alias(), eager)
            _runtimes[key] = rt
            # the processes and helpers that read the environment follow the same database
            os.environ["RECONCILE_DATABASE_URL"] = configuration[0]
        return rt


def close_connections() -> None:
    """Close the library's pooled database connections in this process and forget its
    runtimes; the next use opens new ones. Call it before a database the library used is
    dropped (the test helpers do: :mod:`reconcile.contrib.django.testing`)."""
    from ... import tasks
    from ...db.session import dispose_engines

    with _lock:
        _runtimes.clear()
        tasks.reset_runtime()
        dispose_engines(close=True)
