"""Figure 8 — the operator console on a 1,000,000-row ``jobs`` table: the render time of "needs
attention" and of a job's story, and an EXPLAIN of every list query it runs.

The table is figure 1's (its ``INSERT … SELECT generate_series`` statements, imported: 10,000
in flight, 100 unsettled, history to 1M rows) plus 200 uncertain submissions with their
reservations, 10,000 anomalies (half resolved) and one job with a full story (events, ledger
rows, a webhook delivery, an anomaly). The pages are rendered by the console app itself
(``reconcile.console.create_app``, Starlette's test client in this process: routing, the hook,
every query, Jinja2), each after warm-ups; the statements a page runs are captured from the
engine as they execute and each SELECT is EXPLAINed (ANALYZE) with its own parameters: a list
query that reads ``jobs`` or the anomalies without an index is reported as a sequential scan.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from sqlalchemy import event, text

from .common import log, summary, throwaway_db
from .fig_query import _INFLIGHT_SQL, _UNSETTLED_SQL, _load_history

SIZE = 1_000_000
IN_FLIGHT = 10_000
UNSETTLED = 100
UNCERTAIN = 200
ANOMALIES = 10_000
STORY_JOB = uuid.UUID("00000000-0000-4000-8000-00000000c0de")

_UNCERTAIN_SQL = """
WITH made AS (
  INSERT INTO jobs (id, user_id, job_type, status, progress, created_at, started_at,
    provider_kind, provider_call_started_at, submission_state, provider_model, error_code)
  SELECT gen_random_uuid(), ('00000000-0000-4000-8000-' || lpad(to_hex(g % 5000), 12, '0'))::uuid,
    'image', 'pending', 0, now() - g * interval '1 minute', now() - g * interval '1 minute',
    'fal-queue', now() - g * interval '1 minute', 'uncertain', 'm',
    'UPSTREAM_SUBMISSION_UNCERTAIN'
  FROM generate_series(1, {n}) AS g RETURNING id, user_id, created_at)
INSERT INTO usage_logs (id, job_id, user_id, status, credits, metadata, created_at)
SELECT gen_random_uuid(), id, user_id, 'reserved', 8, '{{"from_sub": 8, "from_topup": 0}}',
  created_at FROM made
"""

_ANOMALY_SQL = """
INSERT INTO reconcile_credit_anomalies (job_id, user_id, kind, detail, created_at, resolved_at,
  resolved_by, resolved_action)
SELECT gen_random_uuid(), gen_random_uuid(),
  (ARRAY['uncertain_unresolved','ledger_error','completed_after_refund'])[1 + g % 3],
  jsonb_build_object('n', g), now() - g * interval '10 seconds',
  CASE WHEN g % 2 = 0 THEN now() END, CASE WHEN g % 2 = 0 THEN 'bench via cli' END,
  CASE WHEN g % 2 = 0 THEN 'fail' END
FROM generate_series(1, {n}) AS g
"""

_STORY_SQL = f"""
INSERT INTO jobs (id, user_id, job_type, status, progress, created_at, started_at, completed_at,
  provider_kind, provider_task_id, provider_call_started_at, submission_state, provider_model,
  credits_actual, poll_generation, poll_seq)
VALUES ('{STORY_JOB}', '00000000-0000-4000-8000-000000000001', 'image', 'completed', 100,
  now() - interval '10 minutes', now() - interval '10 minutes', now() - interval '8 minutes',
  'fal-queue', 'req-story', now() - interval '10 minutes', 'accepted', 'm', 8, 2, 7);
INSERT INTO reconcile_job_events (event_id, job_id, user_id, type, payload, created_at,
  published_at)
SELECT gen_random_uuid()::text, '{STORY_JOB}', '00000000-0000-4000-8000-000000000001',
  (ARRAY['queued','running','completed'])[1 + g % 3], jsonb_build_object('n', g),
  now() - interval '10 minutes' + g * interval '1 second', now()
FROM generate_series(1, 12) AS g;
INSERT INTO usage_logs (id, job_id, user_id, status, credits, metadata, created_at)
VALUES (gen_random_uuid(), '{STORY_JOB}', '00000000-0000-4000-8000-000000000001', 'committed', 8,
  '{{"from_sub": 8, "from_topup": 0}}', now() - interval '10 minutes');
INSERT INTO reconcile_credit_transactions (id, user_id, job_id, type, amount, from_sub,
  from_topup, created_at)
VALUES ('job-usage:{STORY_JOB}', '00000000-0000-4000-8000-000000000001', '{STORY_JOB}', 'USAGE',
  8, 8, 0, now() - interval '10 minutes'),
  ('job-commit:{STORY_JOB}', '00000000-0000-4000-8000-000000000001', '{STORY_JOB}', 'COMMIT', 8,
  8, 0, now() - interval '8 minutes');
INSERT INTO reconcile_webhook_deliveries (provider, delivery_id, upstream_id, job_id,
  received_at, payload_digest, status, payload)
VALUES ('fal', 'd-story', 'req-story', '{STORY_JOB}', now() - interval '8 minutes', 'x', 'OK',
  '{{"request_id": "req-story"}}');
INSERT INTO reconcile_credit_anomalies (job_id, user_id, kind, detail, created_at)
VALUES ('{STORY_JOB}', '00000000-0000-4000-8000-000000000001', 'uncertain_unresolved', '{{}}',
  now() - interval '9 minutes')
"""

# the tables a list reads; a sequential scan of one of them is what the check reports
LIST_TABLES = ("jobs", "reconcile_credit_anomalies")


class Captured:
    """The statements an engine runs while ``on``: ``(sql, parameters)``."""

    def __init__(self, engine: Any) -> None:
        self.on = False
        self.seen: list[tuple[str, Any]] = []
        event.listen(engine, "before_cursor_execute", self._before)

    def _before(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
                executemany: bool) -> None:
        if self.on and statement.lstrip().upper().startswith("SELECT"):
            self.seen.append((statement, parameters))


def _plan(conn: Any, sql: str, params: Any) -> dict[str, Any]:
    row = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).scalar_one()
    plan = row[0]
    indexes: list[str] = []
    seq: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if node.get("Index Name"):
            indexes.append(node["Index Name"])
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in LIST_TABLES:
            seq.append(node["Relation Name"])
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    tables = [t for t in LIST_TABLES if f" {t}" in sql or f"FROM {t}" in sql]
    flat = " ".join(sql.split())
    return {"sql": flat[flat.find(" FROM ") + 1:][:300], "tables": tables, "indexes": sorted(set(indexes)),
            "seq_scans": seq, "execution_ms": round(plan["Execution Time"], 3)}


def _render(client: Any, path: str, runs: int) -> dict[str, Any]:
    for _ in range(3):
        assert client.get(path).status_code == 200, path
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = client.get(path)
        samples.append((time.perf_counter() - t0) * 1000.0)
        assert r.status_code == 200, path
    return {"ms": summary(samples, 1), "bytes": len(r.content)}


def run(quick: bool = False) -> dict[str, Any]:
    from starlette.testclient import TestClient

    from reconcile.console import OperatorIdentity, create_app
    from reconcile.db.session import make_engine, make_sessionmaker
    from reconcile.runtime import Runtime
    from reconcile.settings import Settings
    from reconcile.storage import LocalStorage

    size = 100_000 if quick else SIZE
    runs = 10 if quick else 30
    out: dict[str, Any] = {"jobs": size, "in_flight": IN_FLIGHT, "uncertain": UNCERTAIN,
                           "unsettled": UNSETTLED, "anomalies": ANOMALIES}
    with throwaway_db("console") as (url, _), TemporaryDirectory() as tmp:
        engine = make_engine(url, pool_size=2, max_overflow=0)
        t0 = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(text(_INFLIGHT_SQL.format(n=IN_FLIGHT)))
            conn.execute(text(_UNSETTLED_SQL.format(n=UNSETTLED)))
            conn.execute(text(_UNCERTAIN_SQL.format(n=UNCERTAIN)))
            conn.execute(text(_ANOMALY_SQL.format(n=ANOMALIES)))
            for statement in _STORY_SQL.split(";\n"):
                conn.execute(text(statement))
        with engine.begin() as conn:
            _load_history(conn, IN_FLIGHT + UNSETTLED + UNCERTAIN + 2, size)
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
        out["load_seconds"] = round(time.perf_counter() - t0, 1)
        log(f"fig8: {size:,} jobs loaded + VACUUM ANALYZE in {out['load_seconds']} s")

        rt = Runtime(settings=Settings(database_url=url), sessions=make_sessionmaker(engine),
                     storage=LocalStorage(Path(tmp)), enqueue_create=lambda *a, **k: None,
                     enqueue_poll=lambda *a, **k: None)
        app = create_app(rt, authorize=lambda r: OperatorIdentity("bench", True, True))
        captured = Captured(engine)
        with TestClient(app, base_url="http://127.0.0.1") as client:
            out["needs_attention"] = _render(client, "/", runs)
            out["job_story"] = _render(client, f"/jobs/{STORY_JOB}", runs)
            first = client.get("/lists/uncertain").text
            cursor = first.split('id="next" href="/lists/uncertain?after=', 1)[-1].split('"')[0]
            out["uncertain_page_2"] = _render(
                client, f"/lists/uncertain?after={cursor.replace('&amp;', '&')}", runs)
            captured.on = True
            client.get("/")
            client.get(f"/jobs/{STORY_JOB}")
            captured.on = False
        with engine.connect() as conn:
            plans = [_plan(conn, sql, params) for sql, params in captured.seen]
            conn.rollback()
        engine.dispose()
    lists = [p for p in plans if p["tables"]]
    out["explain"] = lists
    out["list_queries"] = len(lists)
    out["seq_scans"] = [p for p in lists if p["seq_scans"]]
    out["all_use_an_index"] = not out["seq_scans"] and all(p["indexes"] for p in lists)
    out["measured_at"] = datetime.now(UTC).isoformat()
    log(f"fig8: needs attention p50 {out['needs_attention']['ms']['p50']} ms, story p50 "
        f"{out['job_story']['ms']['p50']} ms; {len(lists)} list queries, "
        f"{len(out['seq_scans'])} with a sequential scan")
    return out
