"""The library's own migrations (the Alembic revisions of ``reconcile db upgrade``: the same
SQL, the same ``reconcile_alembic_version``) run by ``manage.py migrate`` on the database of the
connection being migrated; ``manage.py migrate reconcile zero`` runs their downgrade.

It runs after the first migration of ``RECONCILE["jobs_app"]`` (the app that creates ``jobs``
and ``usage_logs``; ``("label", "migration")`` names a later one). Not atomic: the revisions
manage their own transactions on their own connection (``CREATE INDEX CONCURRENTLY``).
"""

from __future__ import annotations

from django.db import migrations

from reconcile.contrib.django import jobs_migration, url_for


def upgrade(apps, schema_editor):  # type: ignore[no-untyped-def]
    from reconcile.db.migrate import upgrade as library_upgrade

    library_upgrade(url_for(schema_editor.connection.settings_dict))


def downgrade(apps, schema_editor):  # type: ignore[no-untyped-def]
    from reconcile.db.migrate import downgrade as library_downgrade
    from reconcile.db.session import dispose_engines

    dispose_engines()  # a pooled connection of this process would block the DROPs
    library_downgrade(url_for(schema_editor.connection.settings_dict))


class Migration(migrations.Migration):
    atomic = False
    initial = True
    dependencies = [jobs_migration()] if jobs_migration() else []
    operations = [migrations.RunPython(upgrade, downgrade, elidable=False)]
