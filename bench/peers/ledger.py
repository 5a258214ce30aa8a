"""The peers' jobs table and minimal money-safe ledger (PostgreSQL), shared by plain Celery and
DBOS so that both write the same rows the same way.

* **reserve** at submit, in the transaction that inserts the job: the balance goes down by the
  job's credits (never below zero) and a ``reserve`` entry is written;
* **commit** at completion, in the transaction that writes the result;
* **refund** at failure, in the transaction that marks the job failed: the credits go back.

Each is idempotent: one entry per (job, kind), and at most one settlement (``commit`` or
``refund``) per job (a partial unique index), so a task or step that runs twice (a redelivery,
a recovery) settles once. Every function takes a SQLAlchemy connection inside a transaction
(``engine.begin()``) and adds its statements to it.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import text

SCHEMA = """
CREATE TABLE peer_jobs (
  id uuid PRIMARY KEY,
  user_id uuid NOT NULL,
  status text NOT NULL DEFAULT 'pending'
    CHECK (status IN ('pending', 'running', 'completed', 'failed')),
  credits bigint NOT NULL CHECK (credits > 0),
  task_id text,
  result text,
  error text,
  created_at timestamptz NOT NULL DEFAULT now(),
  completed_at timestamptz
);
CREATE TABLE peer_balances (
  user_id uuid PRIMARY KEY,
  credits bigint NOT NULL CHECK (credits >= 0),
  granted bigint NOT NULL
);
CREATE TABLE peer_ledger (
  job_id uuid NOT NULL REFERENCES peer_jobs (id),
  kind text NOT NULL CHECK (kind IN ('reserve', 'commit', 'refund')),
  amount bigint NOT NULL CHECK (amount > 0),
  at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (job_id, kind)
);
CREATE UNIQUE INDEX peer_ledger_one_settlement ON peer_ledger (job_id) WHERE kind <> 'reserve';
"""


class InsufficientCredits(Exception):
    pass


def create_schema(conn: Any) -> None:
    for statement in SCHEMA.split(";"):
        if statement.strip():
            conn.execute(text(statement))


def grant(conn: Any, users: list[uuid.UUID], amount: int) -> None:
    conn.execute(text("INSERT INTO peer_balances (user_id, credits, granted) "
                      "SELECT u, :a, :a FROM unnest(CAST(:users AS uuid[])) AS u"),
                 {"users": [str(u) for u in users], "a": amount})


def submit(conn: Any, job_id: uuid.UUID, user_id: uuid.UUID, credits: int) -> bool:
    """Insert the job and reserve its credits; False (nothing written) for a job id already
    submitted. Raises :class:`InsufficientCredits` (the caller's transaction must roll back)."""
    inserted = conn.execute(text(
        "INSERT INTO peer_jobs (id, user_id, credits) VALUES (:id, :u, :c) "
        "ON CONFLICT (id) DO NOTHING RETURNING id"),
        {"id": job_id, "u": user_id, "c": credits}).first()
    if inserted is None:
        return False
    taken = conn.execute(text(
        "UPDATE peer_balances SET credits = credits - :c WHERE user_id = :u AND credits >= :c"),
        {"u": user_id, "c": credits}).rowcount
    if taken != 1:
        raise InsufficientCredits(str(user_id))
    conn.execute(text("INSERT INTO peer_ledger (job_id, kind, amount) VALUES (:id, 'reserve', :c)"),
                 {"id": job_id, "c": credits})
    return True


def record_task(conn: Any, job_id: uuid.UUID | str, task_id: str) -> None:
    """The upstream task id, once (a second create's id does not overwrite the first)."""
    conn.execute(text("UPDATE peer_jobs SET task_id = :t, status = 'running' "
                      "WHERE id = :id AND task_id IS NULL AND status = 'pending'"),
                 {"id": job_id, "t": task_id})


def complete(conn: Any, job_id: uuid.UUID | str, result: str) -> bool:
    """Commit the reservation and write the result; False when the job was settled already."""
    settled = conn.execute(text(
        "INSERT INTO peer_ledger (job_id, kind, amount) "
        "SELECT id, 'commit', credits FROM peer_jobs WHERE id = :id "
        "ON CONFLICT DO NOTHING RETURNING job_id"), {"id": job_id}).first()
    if settled is None:
        return False
    conn.execute(text("UPDATE peer_jobs SET status = 'completed', result = :r, "
                      "completed_at = now() WHERE id = :id"), {"id": job_id, "r": result})
    return True


def fail(conn: Any, job_id: uuid.UUID | str, error: str) -> bool:
    """Refund the reservation and mark the job failed; False when it was settled already."""
    refund = conn.execute(text(
        "INSERT INTO peer_ledger (job_id, kind, amount) "
        "SELECT id, 'refund', credits FROM peer_jobs WHERE id = :id "
        "ON CONFLICT DO NOTHING RETURNING amount"), {"id": job_id}).first()
    if refund is None:
        return False
    conn.execute(text("UPDATE peer_balances b SET credits = b.credits + :a FROM peer_jobs j "
                      "WHERE j.id = :id AND b.user_id = j.user_id"), {"id": job_id, "a": refund[0]})
    conn.execute(text("UPDATE peer_jobs SET status = 'failed', error = :e, completed_at = now() "
                      "WHERE id = :id"), {"id": job_id, "e": error})
    return True


_CHECK = """
SELECT j.status, count(*) AS jobs,
  count(*) FILTER (WHERE r.amount IS DISTINCT FROM j.credits) AS bad_reserve,
  count(*) FILTER (WHERE j.status = 'completed' AND (c.amount IS DISTINCT FROM r.amount
                                                    OR f.amount IS NOT NULL)) AS bad_commit,
  count(*) FILTER (WHERE j.status = 'failed' AND (f.amount IS DISTINCT FROM r.amount
                                                 OR c.amount IS NOT NULL)) AS bad_refund,
  count(*) FILTER (WHERE j.status IN ('pending', 'running')
                   AND (c.amount IS NOT NULL OR f.amount IS NOT NULL)) AS settled_in_flight,
  count(*) FILTER (WHERE j.status = 'completed' AND j.result IS NULL) AS no_result
FROM peer_jobs j
LEFT JOIN peer_ledger r ON r.job_id = j.id AND r.kind = 'reserve'
LEFT JOIN peer_ledger c ON c.job_id = j.id AND c.kind = 'commit'
LEFT JOIN peer_ledger f ON f.job_id = j.id AND f.kind = 'refund'
GROUP BY j.status
"""

_USERS = """
SELECT count(*) FILTER (WHERE b.granted <> b.credits + coalesce(h.held, 0)
                                          + coalesce(h.committed, 0)) AS unbalanced_users
FROM peer_balances b LEFT JOIN (
  SELECT j.user_id,
    sum(j.credits) FILTER (WHERE j.status IN ('pending', 'running')) AS held,
    sum(j.credits) FILTER (WHERE j.status = 'completed') AS committed
  FROM peer_jobs j GROUP BY j.user_id) h ON h.user_id = b.user_id
"""


def check(conn: Any) -> dict[str, Any]:
    """The ledger's state: jobs per status and every imbalance found (``problems``, empty when
    it balances): a job whose reservation is not its credits, a completed job whose commit is
    not its reservation (or that was refunded), a failed job not refunded in full, a job in
    flight already settled, a user whose grant is not balance + held + committed."""
    by_status: dict[str, int] = {}
    problems: dict[str, int] = {}
    for row in conn.execute(text(_CHECK)).mappings():
        by_status[row["status"]] = int(row["jobs"])
        for key in ("bad_reserve", "bad_commit", "bad_refund", "settled_in_flight", "no_result"):
            if row[key]:
                problems[key] = problems.get(key, 0) + int(row[key])
    unbalanced = int(conn.execute(text(_USERS)).scalar_one())
    if unbalanced:
        problems["unbalanced_users"] = unbalanced
    return {"by_status": by_status, "problems": problems}
