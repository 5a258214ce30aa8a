"""Internal: the compare-and-set every guarded write of ``jobs`` goes through, and the row load."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ..db.models import Job


def load(session: Session, job_id: uuid.UUID, *, lock: bool = False) -> Job | None:
    stmt = select(Job).where(Job.id == job_id)
    if lock:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def _cas(session: Session, *where: Any, **values: Any) -> Job | None:
    """UPDATE jobs SET values WHERE where RETURNING the row (None: lost)."""
    stmt = update(Job).where(*where).values(**values).returning(Job)
    # populate_existing: the returned object carries the values just written, even when the
    # session had loaded the row before the UPDATE
    row = session.execute(
        stmt, execution_options={"synchronize_session": False, "populate_existing": True}
    ).scalar_one_or_none()
    return row
