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

from reconcile.db.migrate import add_library_column, drop_library_column, set_lock_timeout

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    set_lock_timeout()
    add_library_column("jobs", "poll_resumes", "integer", "INTEGER")


def downgrade() -> None:
    set_lock_timeout()
    drop_library_column("jobs", "poll_resumes")
