"""How many storers may still be storing a success's outputs: ``jobs.storing_count``.

Beside ``jobs.storing_until`` (revision 0031): each reader that read "succeeded" and starts
storing the outputs adds one (the first after the mark has ended starts again at one), and a
storing that fails takes its one back. The failure at the exhaustion horizon waits while the
mark lasts and someone is counted, so one storer's failure never fails a job another storer is
still storing, and a storer that died is forgotten when the mark ends.

Nullable, no default: adding it rewrites nothing; NULL counts as none. The column is recorded
as the library's (a downgrade drops it only if this revision added it).

Revision ID: 0032
Revises: 0031
"""

from reconcile.db.migrate import add_library_column, drop_library_column, set_lock_timeout

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    set_lock_timeout()
    add_library_column("jobs", "storing_count", "integer", "INTEGER")


def downgrade() -> None:
    set_lock_timeout()
    drop_library_column("jobs", "storing_count")
