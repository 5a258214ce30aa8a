"""Until when a success's outputs may still be being stored: ``jobs.storing_until``.

Whoever reads "succeeded" — a poller under its turn or claim, the sweep, the heartbeat reaper —
marks the row before it fetches and uploads the outputs, for as long as that may take
(``lifecycle.storing_hold``). While the mark lasts, no read that is no verdict fails the job at
its exhaustion horizon (``lifecycle.exhaust``): a stale "not found" read by another poller or
reader meanwhile would otherwise fail and refund a job whose task succeeded, and the storer's
completion would lose. Turn leases, batch claims and heartbeats stay what they are (a dead
worker is still noticed at once); the mark only withholds the failure.

Nullable, no default: adding it rewrites nothing; NULL is no mark. The column is recorded as
the library's (a downgrade drops it only if this revision added it).

Revision ID: 0031
Revises: 0030
"""

from reconcile.db.migrate import add_library_column, drop_library_column, set_lock_timeout

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    set_lock_timeout()
    add_library_column("jobs", "storing_until", "timestamptz", "DATETIME")


def downgrade() -> None:
    set_lock_timeout()
    drop_library_column("jobs", "storing_until")
