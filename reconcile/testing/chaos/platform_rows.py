"""Internal: the platform's own rows a chaos run mixes in (``JobSpec.platform``): rows the library
did not submit (no ``submission_state``, a reservation the platform made) of a provider kind no
process registered (:data:`~.plan.UNKNOWN_KIND`) and of the run's observe-only kind
(:data:`~.plan.OBSERVED_KIND`). The adoption rules leave both alone under the defaults
(``LEGACY_SWEEP=observe``; README, Design notes: Legacy rows): an anomaly at most, never failed,
committed or refunded — :func:`check_platform_rows` holds every one to that."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from .control import _Run, log
from .plan import JobSpec

# the job_type of the platform's rows (the run's own rows are "chaos")
PLATFORM_JOB_TYPE = "chaos-platform"


def insert_platform_row(state: _Run, rt: Any, spec: JobSpec, user: uuid.UUID) -> bool:
    """The platform's worker starting its own job: the row (its call marked as started) and its
    reservation, in one transaction; retried through terminated backends (same job id)."""
    from sqlalchemy.exc import IntegrityError

    from ... import jobstore

    job_id = uuid.UUID(spec.job_id)
    for attempt in range(5):
        try:
            with rt.sessions.begin() as session:
                now = rt.now()
                jobstore.insert_job(session, id=job_id, user_id=user,
                                    job_type=PLATFORM_JOB_TYPE, status="processing",
                                    provider_kind=spec.kind, created_at=now, started_at=now,
                                    provider_call_started_at=now)
                session.flush()
                rt.ledger.reserve(session, user, job_id, spec.credits, now=now)
            state.bump("platform_rows")
            return True
        except IntegrityError:  # an earlier try committed before its connection died
            state.bump("platform_rows")
            return True
        except Exception as exc:
            log.info("chaos_platform_row_retry job_id=%s attempt=%d error=%s", job_id, attempt,
                     exc)
            time.sleep(0.1)
    state.bump("submit_failed")
    with state.lock:
        state.failed_submits.add(job_id)
    return False


def check_platform_rows(rt: Any, specs: Iterable[JobSpec], jobs: Mapping[uuid.UUID, Any],
                        settlements: Counter[uuid.UUID]) -> list[str]:
    """Every platform row exactly as the platform left it: in flight, no error, nothing settled
    (``credits_actual``, a commit or a refund), its usage log still ``reserved``."""
    from sqlalchemy import select

    from ...db.models import UsageLog

    ids = [uuid.UUID(s.job_id) for s in specs if s.platform]
    with rt.sessions() as session:
        logs = {job_id: status for job_id, status in session.execute(
            select(UsageLog.job_id, UsageLog.status).where(UsageLog.job_id.in_(ids)))} \
            if ids else {}
    found = []
    for job_id in ids:
        job = jobs.get(job_id)
        if job is None:
            continue  # never inserted (missing_job is reported by the caller)
        touched = (job.status != "processing" or job.error_code is not None
                   or job.credits_actual is not None or settlements[job_id]
                   or logs.get(job_id) != "reserved")
        if touched:
            found.append(f"platform_row_touched {job_id} ({job.provider_kind}) status="
                         f"{job.status}:{job.error_code or 'ok'} credits_actual="
                         f"{job.credits_actual} usage_log={logs.get(job_id)} "
                         f"settlements={settlements[job_id]}")
    return found
