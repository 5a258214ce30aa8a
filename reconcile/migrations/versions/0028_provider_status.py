"""The provider's last reported status: ``jobs.provider_status``.

The raw status token the provider gave at the latest status read of a job in flight (as its
adapter returned it in ``PollResult.raw_status``, bounded by the library before it is written),
so that a rule about a status — a row of the sweep's decision table, a settlement cause — can
read it from the row. Nullable, no default: adding it rewrites nothing, and a row written
before this revision (or never read yet) holds NULL. Text, like every text column of the
library: the bound is the writer's (``reconcile.jobstore.PROVIDER_STATUS_MAX``), so a longer
value is cut, never refused by the column.

The column is recorded as the library's (a downgrade drops it only if this revision added it).

Revision ID: 0028
Revises: 0027
"""

from alembic import op
from reconcile.db.migrate import (
    drop_recorded,
    is_pg,
    record,
    record_missing_columns,
    set_lock_timeout,
    sqlite_has_column,
)

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

COLUMN = "provider_status"


def upgrade() -> None:
    set_lock_timeout()
    if is_pg():
        record_missing_columns("jobs", [COLUMN])
        op.execute(f"ALTER TABLE jobs ADD COLUMN IF NOT EXISTS {COLUMN} text")
    elif not sqlite_has_column("jobs", COLUMN):
        op.execute(f"ALTER TABLE jobs ADD COLUMN {COLUMN} TEXT")
        record(f"column:jobs.{COLUMN}")


def downgrade() -> None:
    set_lock_timeout()
    drop_recorded("column:", only={f"column:jobs.{COLUMN}"})
