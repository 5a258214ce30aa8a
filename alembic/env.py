"""The checkout's Alembic environment: it runs the packaged one, ``reconcile/migrations/env.py``.

There is one copy of each revision, in ``reconcile/migrations/versions`` (``alembic.ini``'s
``version_locations``), so ``alembic -c alembic.ini …`` from a checkout and ``reconcile db
upgrade`` from an installed wheel apply the same files.
"""

import runpy

from reconcile.migrations import LOCATION

runpy.run_path(str(LOCATION / "env.py"), run_name="reconcile_migrations_env")
