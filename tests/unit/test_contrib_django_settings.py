"""``reconcile.contrib.django``: the library's settings from the Django settings (one RECONCILE
dict, the database from ``DATABASES``), and what reaches the environment workers read."""

from __future__ import annotations

import os
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

django = pytest.importorskip("django")

from django.conf import settings as django_settings  # noqa: E402
from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.test import override_settings  # noqa: E402

from reconcile import Settings  # noqa: E402
from reconcile.contrib import django as contrib  # noqa: E402

PG = {"ENGINE": "django.db.backends.postgresql", "NAME": "app", "USER": "app",
      "PASSWORD": "p@ss:/w?rd", "HOST": "db.internal", "PORT": "6432",
      "OPTIONS": {"sslmode": "require", "pool": True, "server_side_binding": True}}


@pytest.fixture(scope="module", autouse=True)
def configured(tmp_path_factory: pytest.TempPathFactory) -> None:
    if not django_settings.configured:
        folder = tmp_path_factory.mktemp("django")
        django_settings.configure(DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(folder / "app.db")},
            "pg": PG,
        }, INSTALLED_APPS=[])


@pytest.fixture(autouse=True)
def environment() -> Iterator[None]:
    """export_environment writes RECONCILE_*: put the process's own back afterwards."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("RECONCILE_")}
    yield
    for key in [k for k in os.environ if k.startswith("RECONCILE_")]:
        del os.environ[key]
    os.environ.update(saved)


def test_a_postgresql_database_becomes_a_psycopg_url_with_its_credentials_and_libpq_options() -> None:
    url = make_url(contrib.url_for(PG))
    assert (url.drivername, url.username, url.password, url.host, url.port, url.database) == \
        ("postgresql+psycopg", "app", "p@ss:/w?rd", "db.internal", 6432, "app")
    # libpq's options pass; Django's own (the pool, server-side binding) do not apply
    assert dict(url.query) == {"sslmode": "require"}
    socket = make_url(contrib.url_for({**PG, "HOST": "", "PORT": "", "PASSWORD": "", "OPTIONS": {}}))
    assert (socket.host, socket.port, socket.password) == (None, None, None)


def test_an_sqlite_file_is_absolute_and_an_in_memory_or_other_database_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert contrib.url_for({"ENGINE": "django.db.backends.sqlite3", "NAME": "dev.db"}) == \
        f"sqlite:///{tmp_path / 'dev.db'}"
    for name in (":memory:", "file:memorydb_default?mode=memory&cache=shared", ""):
        with pytest.raises(ImproperlyConfigured, match="SQLite file"):
            contrib.url_for({"ENGINE": "django.db.backends.sqlite3", "NAME": name})
    with pytest.raises(ImproperlyConfigured, match="PostgreSQL and SQLite"):
        contrib.url_for({"ENGINE": "django.db.backends.mysql", "NAME": "app"})


def test_settings_come_from_the_dict_and_the_database_from_the_alias() -> None:
    with override_settings(RECONCILE={"database_alias": "pg", "jobs_app": "platform",
                                      "cancel_refund": "1/2", "SWEEP_INTERVAL": 60,
                                      "media_allowed_hosts": ["127.0.0.1:9000"]}):
        settings = contrib.settings()
        assert contrib.jobs_migration() == ("platform", "__first__")
    assert settings.database_url == contrib.url_for(PG)
    assert settings.cancel_refund == Fraction(1, 2) and settings.sweep_interval == 60
    assert settings.media_allowed_hosts == ["127.0.0.1:9000"]
    with override_settings(RECONCILE={}):
        assert contrib.settings().database_url.startswith("sqlite:///")  # "default"
        assert contrib.jobs_migration() is None
    with override_settings(RECONCILE={"jobs_app": ("platform", "0002_usage_logs")}):
        assert contrib.jobs_migration() == ("platform", "0002_usage_logs")


def test_the_broker_is_celerys_when_neither_the_dict_nor_the_environment_names_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A web process that submits without importing the project's Celery app sends through the
    library's own app: with the library's default broker (``filesystem://``, a folder in the
    web server's working directory) no worker would ever see its creates, and every job would
    wait for the sweep. Django's ``CELERY_BROKER_URL`` is the broker the workers read."""
    monkeypatch.delenv("RECONCILE_BROKER_URL", raising=False)
    celery = "redis://127.0.0.1:6379/3"
    with override_settings(RECONCILE={}, CELERY_BROKER_URL=celery):
        assert contrib.settings().broker_url == celery
        assert contrib.export_environment().broker_url == celery
        assert Settings().broker_url == celery  # what the workers and the CLI read
    with override_settings(RECONCILE={"broker_url": "amqp://127.0.0.1//"},
                           CELERY_BROKER_URL=celery):
        assert contrib.settings().broker_url == "amqp://127.0.0.1//"  # the dict wins
    monkeypatch.setenv("RECONCILE_BROKER_URL", "redis://127.0.0.1:6379/9")
    with override_settings(RECONCILE={}, CELERY_BROKER_URL=celery):
        assert contrib.settings().broker_url == "redis://127.0.0.1:6379/9"  # so does the env


def test_runtime_options_name_a_function_that_returns_the_runtimes_keyword_arguments() -> None:
    with override_settings(RECONCILE={"runtime_options": "builtins.dict"}):
        assert contrib.runtime_options() == {}
        contrib.settings()  # the integration's own key: no library setting of that name
        assert "RECONCILE_RUNTIME_OPTIONS" not in os.environ
    assert contrib.runtime_options() == {}  # none named
    for value, message in (("no_such_module.options", "runtime_options"),
                           ("builtins.list", "must return a dict"), (dict, "dotted path")):
        with override_settings(RECONCILE={"runtime_options": value}), \
                pytest.raises(ImproperlyConfigured, match=message):
            contrib.runtime_options()


@pytest.mark.parametrize(("config", "message"), [
    ({"sweep_intervall": 60}, "unknown setting.*sweep_intervall"),
    ({"database_url": "postgresql://elsewhere/db"}, "the database is DATABASES"),
    ({"database_alias": "replica"}, "'replica': no such entry in DATABASES"),
    ({"cancel_refund": 0.5}, "cancel_refund"),
    ([("broker_url", "redis://")], "must be a dict"),
])
def test_a_bad_reconcile_dict_is_a_clear_error(config: object, message: str) -> None:
    with override_settings(RECONCILE=config), pytest.raises(ImproperlyConfigured, match=message):
        contrib.settings()


def test_the_environment_workers_read_holds_the_same_settings() -> None:
    """The app's ready() exports the dict and the database: Settings() — what the Celery
    settings, the workers' runtime and the start-up checks build — equals contrib.settings()."""
    os.environ["RECONCILE_DATABASE_URL"] = "postgresql://someone-else/db"
    config = {"database_alias": "pg", "cancel_refund": "1/3", "legacy_sweep": "off",
              "observe_only_kinds": ["legacy", "kie-standard"], "time_scale": 0.05,
              "job_events_retention_days": None}
    with override_settings(RECONCILE=config):
        exported = contrib.export_environment()
        assert exported == contrib.settings()
    assert Settings() == exported
    assert os.environ["RECONCILE_DATABASE_URL"] == contrib.url_for(PG)
    assert Settings().observe_only_kinds == ["legacy", "kie-standard"]
    assert Settings().cancel_refund == Fraction(1, 3)


def test_an_entrys_expires_becomes_django_celery_beats_whole_expire_seconds() -> None:
    from datetime import timedelta

    from reconcile.contrib.django.beat import expire_seconds

    assert [expire_seconds({"expires": v}) for v in (1.0, 0.2, 20.5, 3600, timedelta(minutes=1))] \
        == [1, 1, 21, 3600, 60]
    # nothing to keep: no expiry, or not a relative one
    assert [expire_seconds(o) for o in ({}, {"expires": None}, {"expires": True},
                                        {"expires": 0}, {"expires": "soon"})] == [None] * 5


def test_eager_polls_the_chain_in_the_request_whatever_the_default_mode() -> None:
    """``RECONCILE["eager"]`` steps the poll chain inline: batch mode (the default) has no poll
    message to run, so an eager configuration polls as ``chain``; one that asks for batch is
    refused with its fix."""
    with override_settings(RECONCILE={"eager": True}):
        assert contrib.settings().poll_mode == "chain"
    with override_settings(RECONCILE={"eager": True, "poll_mode": "chain"}):
        assert contrib.settings().poll_mode == "chain"
    with override_settings(RECONCILE={}):
        assert contrib.settings().poll_mode == Settings().poll_mode == "batch"
    with override_settings(RECONCILE={"eager": True, "poll_mode": "batch"}), \
            pytest.raises(ImproperlyConfigured, match="eager.*poll_mode"):
        contrib.settings()


@pytest.mark.parametrize(("config", "named"), [
    ({"time_scale": Fraction(1, 10)}, "time_scale"),  # exported as "1/10": no float
    ({"heartbeat_interval": True}, "heartbeat_interval"),  # exported as "true"
])
def test_a_value_the_environment_cannot_carry_is_a_clear_error(config: dict[str, object],
                                                              named: str) -> None:
    # the dict loads (pydantic takes them), the workers' environment would not: it was a raw
    # pydantic ValidationError from ready()
    with override_settings(RECONCILE=config):
        contrib.settings()
        with pytest.raises(ImproperlyConfigured, match=f"RECONCILE: {named} does not read back"):
            contrib.export_environment()


def test_an_environment_variables_error_says_it_came_from_the_environment() -> None:
    os.environ["RECONCILE_SWEEP_INTERVAL"] = "-300"
    with override_settings(RECONCILE={"time_scale": 0.5}), pytest.raises(
            ImproperlyConfigured, match=r"from the environment: RECONCILE_SWEEP_INTERVAL"):
        contrib.settings()
    # the dict's own error names no environment variable
    del os.environ["RECONCILE_SWEEP_INTERVAL"]
    with override_settings(RECONCILE={"sweep_interval": -300}), \
            pytest.raises(ImproperlyConfigured) as refused:
        contrib.settings()
    assert "from the environment" not in str(refused.value) and "sweep_interval" in str(refused.value)
