"""The count of a job's poll resumes: ``jobs.poll_resumes``.

Every resume of a job's polling (``jobstore.start_new_chain``: a webhook's, the sweep's, the
chain's own) adds one. A resume of a generation that never took a turn keeps that generation
and its sequence (so its first message, late in the queue, still runs), so neither moves; this
count does. A reader that holds no turn of its own (the sweep's read, the heartbeat reaper's)
writes its no-verdict outcome only while the count is what its plan saw: a resume meanwhile
means someone else has news of the task, and the stale read fails nothing.

Nullable, no default: adding it rewrites nothing; NULL counts as no resume since this revision
(the writer adds one to ``COALESCE(poll_resumes, 0)``). The column is recorded as the
library's (a downgrade drops it only if this revision added it).

Revision ID: 0030
Revises: 0029
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

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

COLUMN = "poll_resumes"


def upgrade() -> None:
    set_lock_timeout()
    if is_pg():
        record_missing_columns("jobs", [COLUMN])
        op.execute(f"ALTER TABLE jobs ADD COLUMN IF NOT EXISTS {COLUMN} integer")
    elif not sqlite_has_column("jobs", COLUMN):
        op.execute(f"ALTER TABLE jobs ADD COLUMN {COLUMN} INTEGER")
        record(f"column:jobs.{COLUMN}")


def downgrade() -> None:
    set_lock_timeout()
    drop_recorded("column:", only={f"column:jobs.{COLUMN}"})
