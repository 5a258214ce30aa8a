"""Alembic environment for reconcile.

* URL: ``-x url=…``, else ``RECONCILE_DATABASE_URL`` (default an SQLite file).
* Version table: ``reconcile_alembic_version`` — never the platform's ``alembic_version``.
* Autogenerate/check only compares the tables the library maps; the platform's other tables
  are none of its business.
"""

from __future__ import annotations

from sqlalchemy import Engine

from alembic import context
from reconcile.db.models import Base
from reconcile.db.session import make_engine, normalise_url
from reconcile.settings import Settings

VERSION_TABLE = "reconcile_alembic_version"
config = context.config
target_metadata = Base.metadata


def database_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url")
    return normalise_url(url or Settings().database_url)


def include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    if type_ == "table":
        return name in target_metadata.tables
    return True


def run_migrations_offline() -> None:
    context.configure(
        url=database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        version_table=VERSION_TABLE,
        include_object=include_object,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine: Engine = make_engine(database_url())
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table=VERSION_TABLE,
            include_object=include_object,
            transaction_per_migration=True,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
