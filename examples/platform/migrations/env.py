"""acme's Alembic environment. ``include_object`` keeps autogenerate off the library's objects
(its ``reconcile_*`` tables, its columns and indexes on ``jobs``/``usage_logs``)."""

from __future__ import annotations

from logging.config import fileConfig

from acme.models import Base
from acme.settings import database_url
from sqlalchemy import create_engine

from alembic import context
from reconcile.migrations import include_object, normalise_url

config = context.config
if config.config_file_name and not config.attributes.get("skip_logging"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    return normalise_url(context.get_x_argument(as_dictionary=True).get("url") or database_url())


def run() -> None:
    if context.is_offline_mode():
        context.configure(url=_url(), target_metadata=Base.metadata, literal_binds=True,
                          include_object=include_object)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url())
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata,
                          include_object=include_object)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run()
