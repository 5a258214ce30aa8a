"""Bulk fixtures for the worker benchmarks: users with credits, and in-flight jobs with their
reservations, written with set-based SQL (consistent with the ledger: the audit stays clean)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

GRANT = 10**9

_USERS_SQL = """
WITH u AS (SELECT unnest(CAST(:users AS uuid[])) AS id)
, b AS (INSERT INTO reconcile_credit_balances (user_id, sub, topup) SELECT id, :grant, 0 FROM u)
, t AS (INSERT INTO reconcile_credit_transactions (id, user_id, type, amount, from_sub, from_topup, created_at)
        SELECT 'grant-' || id, id, 'GRANT', :grant, :grant, 0, now() FROM u)
INSERT INTO reconcile_credit_lots (user_id, pool, kind, source_txn_id, amount, remaining_amount, created_at)
SELECT id, 'sub', 'GRANT', 'grant-' || id, :grant, :grant, now() FROM u
"""

_JOBS_SQL = """
WITH j AS (
  SELECT unnest(CAST(:ids AS uuid[])) AS id, unnest(CAST(:users AS uuid[])) AS user_id,
         unnest(CAST(:tasks AS text[])) AS task_id)
, ins AS (
  INSERT INTO jobs (id, user_id, job_type, status, input_data, progress, should_watermark,
    is_public, created_at, started_at, provider_kind, provider_task_id, provider_call_started_at,
    submission_state, provider_model, poll_generation, poll_seq, poll_lease_expires_at)
  SELECT id, user_id, 'image', :status, '{"prompt": "bench"}'::jsonb, 0, false, true,
    CAST(:started AS timestamptz), CAST(:started AS timestamptz), :kind, task_id,
    CAST(:started AS timestamptz), 'accepted', :model, 1, 3, CAST(:lease AS timestamptz)
  FROM j)
, logs AS (
  INSERT INTO usage_logs (id, job_id, user_id, status, credits, metadata, created_at)
  SELECT gen_random_uuid(), id, user_id, 'reserved', :credits,
         jsonb_build_object('from_sub', :credits, 'from_topup', 0), CAST(:started AS timestamptz)
  FROM j)
INSERT INTO reconcile_credit_transactions (id, user_id, job_id, type, amount, from_sub, from_topup, created_at)
SELECT 'job-usage:' || id, user_id, id, 'USAGE', :credits, :credits, 0, CAST(:started AS timestamptz)
FROM j
"""


def add_users(conn: Any, users: Sequence[uuid.UUID]) -> None:
    conn.execute(text(_USERS_SQL), {"users": [str(u) for u in users], "grant": GRANT})


def add_inflight_jobs(conn: Any, jobs: Sequence[tuple[uuid.UUID, uuid.UUID, str]], *,
                      kind: str, model: str, started: datetime, lease: datetime,
                      credits: int = 10, status: str = "processing") -> None:
    """Accepted jobs (id, user, upstream task id) with a reservation each; the balances are
    lowered by what is reserved."""
    conn.execute(text(_JOBS_SQL), {
        "ids": [str(j) for j, _, _ in jobs], "users": [str(u) for _, u, _ in jobs],
        "tasks": [t for _, _, t in jobs], "kind": kind, "model": model, "status": status,
        "started": started, "lease": lease, "credits": credits,
    })
    conn.execute(text(
        "UPDATE reconcile_credit_balances b SET sub = b.sub - r.held FROM ("
        " SELECT user_id, sum(credits) AS held FROM usage_logs WHERE job_id = ANY(CAST(:ids AS uuid[]))"
        " GROUP BY user_id) r WHERE b.user_id = r.user_id"), {"ids": [str(j) for j, _, _ in jobs]})
    conn.execute(text(
        "UPDATE reconcile_credit_lots l SET remaining_amount = b.sub FROM reconcile_credit_balances b "
        "WHERE l.user_id = b.user_id AND l.kind = 'GRANT' AND l.pool = 'sub' "
        "AND b.user_id = ANY(CAST(:users AS uuid[]))"),
        {"users": sorted({str(u) for _, u, _ in jobs})})


def spread(job_ids: Sequence[uuid.UUID], users: Sequence[uuid.UUID],
           tasks: Sequence[str]) -> list[tuple[uuid.UUID, uuid.UUID, str]]:
    """:func:`add_inflight_jobs`' rows: each job with its upstream task, the users in turn."""
    return [(j, users[i % len(users)], t) for i, (j, t) in enumerate(zip(job_ids, tasks,
                                                                        strict=True))]


def sim_tasks(sim: Any, job_ids: Sequence[uuid.UUID], model: str = "m") -> list[str]:
    """One upstream KIE market task per job, created directly in the in-process simulator (the
    default script decides its timeline). Returns the task ids."""
    out = []
    for job_id in job_ids:
        task_id = "task_m_" + sim.new_id(16, "0123456789abcdef")
        sim.create(provider="kie", api="kie-market", model=model, task_id=task_id,
                   callback_url=None, body={"model": model, "input": {"prompt": "bench"}},
                   job_id=str(job_id))
        out.append(task_id)
    return out


def add_stale_jobs(engine: Any, sim: Any, n: int, users: int) -> list[uuid.UUID]:
    """Figure 2's backlog: ``n`` in-flight kie-standard jobs over ``users`` fresh users, 15
    minutes past their provider call, their poll lease expired a minute ago, each with its task
    in the simulator (whose default script decides its timeline). Returns the job ids."""
    owners = [uuid.uuid4() for _ in range(users)]
    ids = [uuid.uuid4() for _ in range(n)]
    tasks = sim_tasks(sim, ids)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        add_users(conn, owners)
        add_inflight_jobs(conn, [(j, owners[i % users], t) for i, (j, t) in
                                 enumerate(zip(ids, tasks, strict=True))],
                          kind="kie-standard", model="m", started=now - timedelta(minutes=15),
                          lease=now - timedelta(minutes=1))
    return ids
