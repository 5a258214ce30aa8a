"""Figure 1 — the sweep's candidate query on PostgreSQL at 100,000 and 1,000,000 ``jobs`` rows.

Both sizes hold the same 10,000 in-flight rows; the rest is history (completed / failed /
cancelled, settled). Rows are loaded with ``INSERT … SELECT generate_series`` into a throwaway
database migrated to head, then ANALYZEd. The statements timed are *imported* from
``reconcile.sweep``: ``_phases(now)`` builds them, and each is run exactly as ``sweep._batch``
runs its first page (``LIMIT BATCH_SIZE FOR UPDATE SKIP LOCKED``) on an engine from
``reconcile.db.session.make_engine`` (psycopg 3, server-side binding, auto-prepare).

Three index variants: ``shipped`` (every index the migrations create: 0019's
``jobs_inflight_keyset_idx (provider_call_started_at, id)``; 0022 dropped the one-column
``jobs_inflight_idx``), ``with_single_col_idx`` (the layout before 0022: ``jobs_inflight_idx``
built back beside the keyset index, which let the planner pick it for the walk) and
``no_inflight_idx`` (no in-flight index at all, the rest kept). The
EXPLAIN plan of each is recorded: without an in-flight index the planner does not use
``jobs_inflight_task_idx`` (which also covers in-flight rows with a task id) but scans the table,
i.e. what the seed's table did before migration 135.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text

from .common import log, summary, throwaway_db

IN_FLIGHT = 10_000
UNSETTLED = 100
SIZES = (100_000, 1_000_000)

# one generate_series INSERT per slice of the table; {lo}/{hi} are the series bounds
_HISTORY_SQL = """
INSERT INTO jobs (id, user_id, job_type, status, input_data, output_data, progress,
  should_watermark, is_public, provider, provider_cost, display_cost, created_at, started_at,
  completed_at, provider_kind, provider_task_id, provider_call_started_at, submission_state,
  provider_model, poll_generation, poll_seq, error_code, error_message, credits_actual)
SELECT gen_random_uuid(),
  ('00000000-0000-4000-8000-' || lpad(to_hex(g % 5000), 12, '0'))::uuid,
  (ARRAY['image','video','audio','llm'])[1 + g % 4],
  CASE WHEN g % 100 < 85 THEN 'completed' WHEN g % 100 < 97 THEN 'failed' ELSE 'cancelled' END,
  jsonb_build_object('prompt', 'a cat in a spacesuit, studio light, 35mm, ' || g, 'seed', g),
  CASE WHEN g % 100 < 85 THEN jsonb_build_object('outputs',
       jsonb_build_array(jsonb_build_object('key', 'image/' || g || '/0.png', 'media_type', 'image/png')))
  END,
  100, true, true, 'kie', 0.040000, 40,
  t, t + interval '1 second', t + interval '45 seconds',
  'kie-standard', 'task_sim_' || md5(g::text), t + interval '1 second',
  CASE WHEN g % 100 < 97 THEN 'accepted' ELSE 'rejected' END, 'm', 1, 9,
  CASE WHEN g % 100 BETWEEN 85 AND 96 THEN 'UPSTREAM_FAILED' END,
  CASE WHEN g % 100 BETWEEN 85 AND 96 THEN 'The provider reported fail.' END,
  CASE WHEN g % 100 < 85 THEN 40 ELSE 0 END
FROM (SELECT g, now() - interval '2 hours' - (g * interval '13 seconds') AS t
      FROM generate_series({lo}, {hi}) AS g) s
"""

_INFLIGHT_SQL = """
INSERT INTO jobs (id, user_id, job_type, status, input_data, progress, should_watermark,
  is_public, created_at, started_at, provider_kind, provider_task_id, provider_call_started_at,
  submission_state, provider_model, poll_generation, poll_seq, poll_lease_expires_at,
  claim_token, claim_expires_at)
SELECT gen_random_uuid(),
  ('00000000-0000-4000-8000-' || lpad(to_hex(g % 5000), 12, '0'))::uuid,
  'image',
  CASE WHEN g % 20 < 19 THEN 'processing' ELSE 'pending' END,
  jsonb_build_object('prompt', 'in flight ' || g, 'seed', g), 0, true, true,
  t, t,
  'kie-standard',
  CASE WHEN g % 20 < 19 THEN 'task_sim_' || md5(g::text) END,
  CASE WHEN g % 40 = 39 THEN NULL ELSE t + interval '1 second' END,
  CASE WHEN g % 20 < 19 THEN 'accepted' WHEN g % 40 = 39 THEN 'not_started' ELSE 'submitting' END,
  'm', 1, g % 7,
  CASE WHEN g % 20 < 19 THEN now() + interval '40 seconds' END,
  CASE WHEN g % 40 = 19 THEN md5(g::text) END,
  CASE WHEN g % 40 = 19 THEN now() + interval '2 minutes' END
FROM (SELECT g, now() - (g % 1800) * interval '1 second' AS t
      FROM generate_series(1, {n}) AS g) s
"""

_UNSETTLED_SQL = """
INSERT INTO jobs (id, user_id, job_type, status, progress, created_at, completed_at,
  provider_kind, provider_task_id, provider_call_started_at, submission_state, error_code,
  error_message, next_poll_at, settle_attempts)
SELECT gen_random_uuid(), gen_random_uuid(), 'image', 'failed', 0, now() - interval '1 hour',
  now() - interval '50 minutes', 'kie-standard', 'task_unsettled_' || g,
  now() - interval '1 hour', 'accepted', 'UPSTREAM_FAILED', 'x',
  now() - (g * interval '1 second'), 1
FROM generate_series(1, {n}) AS g
"""


def _load_history(conn: Any, lo: int, hi: int) -> None:
    step = 250_000
    for start in range(lo, hi + 1, step):
        conn.execute(text(_HISTORY_SQL.format(lo=start, hi=min(hi, start + step - 1))))


def _statements(now: datetime) -> dict[str, Any]:
    """The sweep's first-page statements, imported from ``reconcile.sweep``."""
    from reconcile.sweep import BATCH_SIZE, _phases

    return {name: query(None).limit(BATCH_SIZE).with_for_update(skip_locked=True)
            for name, query in _phases(now)}


def _explain(conn: Any, stmt: Any) -> dict[str, Any]:
    compiled = stmt.compile(dialect=conn.dialect)
    sql = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + str(compiled)
    with conn.begin():
        plan = conn.exec_driver_sql(sql, compiled.params).scalar_one()[0]
        conn.rollback()
    nodes: list[str] = []
    conds: list[str] = []

    def walk(node: dict[str, Any], depth: int) -> None:
        label = node["Node Type"]
        if node.get("Index Name"):
            label += f" using {node['Index Name']}"
            if node.get("Index Cond"):
                conds.append(node["Index Cond"])
        if node.get("Relation Name") and not node.get("Index Name"):
            label += f" on {node['Relation Name']}"
        nodes.append("  " * depth + label)
        for child in node.get("Plans", []):
            walk(child, depth + 1)

    walk(plan["Plan"], 0)
    top = plan["Plan"]
    return {"execution_ms": round(plan["Execution Time"], 3),
            "planning_ms": round(plan["Planning Time"], 3), "plan": nodes,
            "index_cond": conds,
            "shared_buffers_hit_read": [top.get("Shared Hit Blocks"), top.get("Shared Read Blocks")]}


def _time_page(conn: Any, stmt: Any, runs: int) -> list[float]:
    """Client-side milliseconds of one locked first page, as ``sweep._batch`` runs it."""
    out = []
    for i in range(runs + 3):
        t0 = time.perf_counter()
        with conn.begin() as tx:
            conn.execute(stmt).fetchall()
            tx.rollback()
        if i >= 3:  # warm-up runs (and psycopg's auto-prepare) are not recorded
            out.append((time.perf_counter() - t0) * 1000.0)
    return out


def _walk(conn: Any, now: datetime) -> dict[str, Any]:
    """Every candidate page of one tick, keyset-paged exactly as ``sweep.sweep`` pages (fetch
    only, no decisions): per phase, pages, rows, milliseconds, and the plan of page 2."""
    from reconcile.db.models import Job
    from reconcile.sweep import BATCH_SIZE, _cursor_of, _phases

    out: dict[str, Any] = {}
    for phase, query in _phases(now):
        cursor, pages, rows, plan = None, 0, 0, None
        t0 = time.perf_counter()
        while True:
            stmt = query(cursor).limit(BATCH_SIZE).with_for_update(skip_locked=True)
            with conn.begin() as tx:
                page = conn.execute(stmt).fetchall()
                tx.rollback()
            pages += 1
            rows += len(page)
            if pages == 2:
                paused = time.perf_counter()
                plan = _explain(conn, stmt)
                t0 += time.perf_counter() - paused
            if len(page) < BATCH_SIZE:
                break
            last = Job(**{k: getattr(page[-1], k) for k in
                          ("id", "provider_call_started_at", "next_poll_at")})
            cursor = _cursor_of(phase, last)
        out[phase] = {"pages": pages, "rows": rows,
                      "ms": round((time.perf_counter() - t0) * 1000.0, 1),
                      "page2_explain": plan}
    out["total_ms"] = round(sum(v["ms"] for v in out.values()), 1)
    return out


def _plan_stability(conn: Any, now: datetime, tries: int) -> dict[str, Any]:
    """Mid-walk page of the ``started`` phase, EXPLAINed after each of ``tries`` fresh ANALYZE
    samples: which plan the planner picks, its row estimate, and what the page costs."""
    from reconcile.sweep import BATCH_SIZE, _phases

    query = dict(_phases(now))["started"]
    mid = conn.execute(text(
        "SELECT provider_call_started_at, id FROM jobs WHERE status IN ('pending', 'processing') "
        "AND provider_call_started_at IS NOT NULL ORDER BY 1, 2 OFFSET :k LIMIT 1"),
        {"k": IN_FLIGHT // 2}).one()
    conn.commit()
    stmt = query(tuple(mid)).limit(BATCH_SIZE).with_for_update(skip_locked=True)
    compiled = stmt.compile(dialect=conn.dialect)
    samples = []
    for _ in range(tries):
        conn.execute(text("ANALYZE jobs"))
        conn.commit()
        with conn.begin():
            plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + str(compiled),
                                        compiled.params).scalar_one()[0]
            conn.rollback()
        node = plan["Plan"]
        while node.get("Plans") and node["Node Type"] in ("Limit", "LockRows"):
            node = node["Plans"][0]
        scan = node
        while scan.get("Plans"):
            scan = scan["Plans"][0]
        samples.append({"top": node["Node Type"], "scan_index": scan.get("Index Name"),
                        "estimated_rows": scan.get("Plan Rows"),
                        "actual_rows": scan.get("Actual Rows"),
                        "execution_ms": round(plan["Execution Time"], 3)})
    full = [x for x in samples if x["top"] == "Sort"]
    return {"tries": tries, "full_sort_plans": len(full), "samples": samples,
            "note": "Sort = every in-flight row past the cursor is read and sorted for each page; "
                    "Incremental Sort = the page stops after 25 rows"}


# variant → (indexes dropped for it, indexes built for it); each is undone after the variant
_VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "shipped": ((), ()),
    "with_single_col_idx": ((), ("jobs_inflight_idx",)),
    "no_inflight_idx": (("jobs_inflight_keyset_idx",), ()),
}
_RECREATE = {
    "jobs_inflight_keyset_idx": "CREATE INDEX jobs_inflight_keyset_idx ON jobs "
                                "(provider_call_started_at, id) "
                                "WHERE status IN ('pending', 'processing')",
    "jobs_inflight_idx": "CREATE INDEX jobs_inflight_idx ON jobs (provider_call_started_at) "
                         "WHERE status IN ('pending', 'processing')",
    "jobs_inflight_task_idx": "CREATE INDEX jobs_inflight_task_idx ON jobs (provider_task_id) "
                              "WHERE status IN ('pending', 'processing') AND provider_task_id IS NOT NULL",
}


def run(quick: bool = False) -> dict[str, Any]:
    from reconcile.db.session import make_engine

    sizes = (20_000, 100_000) if quick else SIZES
    runs_fast, runs_slow = (60, 9) if quick else (150, 5)  # medians: enough within the budget
    result: dict[str, Any] = {
        "query_source": "imported: reconcile.sweep._phases(now), first page "
                        "LIMIT BATCH_SIZE FOR UPDATE SKIP LOCKED (as sweep._batch runs it)",
        "in_flight_rows": IN_FLIGHT, "unsettled_rows": UNSETTLED, "sizes": {},
    }
    with throwaway_db("query") as (url, _):
        engine = make_engine(url, pool_size=1, max_overflow=0)
        loaded = 0
        with engine.begin() as conn:
            t0 = time.perf_counter()
            conn.execute(text(_INFLIGHT_SQL.format(n=IN_FLIGHT)))
            conn.execute(text(_UNSETTLED_SQL.format(n=UNSETTLED)))
            loaded = IN_FLIGHT + UNSETTLED
            log(f"fig1: in-flight rows loaded in {time.perf_counter() - t0:.1f}s")
        for size in sizes:
            t0 = time.perf_counter()
            with engine.begin() as conn:
                _load_history(conn, loaded + 1, size)
            loaded = size
            with engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE jobs"))
            load_s = time.perf_counter() - t0
            log(f"fig1: {size:,} rows loaded + VACUUM ANALYZE in {load_s:.1f}s")
            result["sizes"][str(size)] = _measure(engine, runs_fast, runs_slow, load_s, quick)
        engine.dispose()
    _ratios(result, sizes)
    return result


def _measure(engine: Any, runs_fast: int, runs_slow: int, load_s: float,
             quick: bool = False) -> dict[str, Any]:
    now = datetime.now(UTC)
    stmts = _statements(now)
    out: dict[str, Any] = {"load_seconds": round(load_s, 1), "variants": {}}
    with engine.connect() as conn:
        out["table_mb"] = round(float(conn.execute(text(
            "SELECT pg_total_relation_size('jobs') / 1048576.0")).scalar_one()), 1)
        out["index_mb"] = {name: round(float(mb), 2) for name, mb in conn.execute(text(
            "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) / 1048576.0 "
            "FROM pg_index WHERE indrelid = 'jobs'::regclass AND indexrelid::regclass::text "
            "IN ('jobs_inflight_idx', 'jobs_inflight_keyset_idx')"))}
        for variant, (dropped, built) in _VARIANTS.items():
            for name in dropped:
                with conn.begin():
                    conn.execute(text(f"DROP INDEX {name}"))
            for name in built:
                with conn.begin():
                    conn.execute(text(_RECREATE[name]))
            conn.execute(text("ANALYZE jobs"))
            conn.commit()
            entry: dict[str, Any] = {"dropped": list(dropped), "built": list(built), "phases": {}}
            for phase, stmt in stmts.items():
                plan = _explain(conn, stmt)
                slow = plan["execution_ms"] > 20
                samples = _time_page(conn, stmt, runs_slow if slow else runs_fast)
                entry["phases"][phase] = {"client_ms": summary(samples), "explain": plan}
            if variant != "no_inflight_idx":
                entry["tick_walk"] = _walk(conn, now)
                entry["mid_walk_plan_stability"] = _plan_stability(conn, now, 3 if quick else 4)
            else:
                pages = -(-IN_FLIGHT // 25) + 2
                per_page = sum(p["client_ms"]["p50"] for p in entry["phases"].values()) / 3
                entry["tick_walk_estimate"] = {
                    "ms": round(per_page * pages), "pages": pages,
                    "note": "ESTIMATE: pages x median first-page latency (not run: too slow)"}
            if variant == "with_single_col_idx":
                out["index_mb"].update({name: round(float(mb), 2) for name, mb in conn.execute(
                    text("SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) / "
                         "1048576.0 FROM pg_index WHERE indrelid = 'jobs'::regclass AND "
                         "indexrelid::regclass::text = 'jobs_inflight_idx'"))})
                conn.commit()
            out["variants"][variant] = entry
            for name in built:
                with conn.begin():
                    conn.execute(text(f"DROP INDEX {name}"))
            for name in dropped:
                with conn.begin():
                    conn.execute(text(_RECREATE[name]))
            log(f"fig1:   {variant}: started-phase p50 "
                f"{entry['phases']['started']['client_ms']['p50']} ms")
    return out


def _ratios(result: dict[str, Any], sizes: tuple[int, ...]) -> None:
    small, big = (str(s) for s in sizes)
    head: dict[str, Any] = {}
    for size in (small, big):
        v = result["sizes"][size]["variants"]
        shipped = v["shipped"]["phases"]["started"]["client_ms"]["p50"]
        head[size] = {
            "shipped_p50_ms": shipped,
            "server_ms_shipped": v["shipped"]["phases"]["started"]["explain"]["execution_ms"],
            "no_inflight_idx_p50_ms": v["no_inflight_idx"]["phases"]["started"]["client_ms"]["p50"],
            "server_ms_no_inflight_idx": v["no_inflight_idx"]["phases"]["started"]["explain"]["execution_ms"],
        }
        head[size]["speedup_vs_no_inflight_idx"] = round(head[size]["no_inflight_idx_p50_ms"] / shipped, 1)
    head["growth_shipped_small_to_big"] = round(head[big]["shipped_p50_ms"] / head[small]["shipped_p50_ms"], 2)
    head["growth_no_inflight_idx_small_to_big"] = round(
        head[big]["no_inflight_idx_p50_ms"] / head[small]["no_inflight_idx_p50_ms"], 2)
    walks = {size: result["sizes"][size]["variants"]["shipped"]["tick_walk"]["total_ms"]
             for size in (small, big)}
    head["tick_walk_ms"] = walks
    head["growth_tick_walk_small_to_big"] = round(walks[big] / walks[small], 2)
    # the layout before 0022 (both in-flight indexes) against the shipped one (keyset only)
    single = {}
    for size in (small, big):
        v = result["sizes"][size]["variants"]
        single[size] = {
            "tick_walk_ms_shipped": v["shipped"]["tick_walk"]["total_ms"],
            "tick_walk_ms_with": v["with_single_col_idx"]["tick_walk"]["total_ms"],
            "first_page_p50_ms_shipped": {p: v["shipped"]["phases"][p]["client_ms"]["p50"]
                                          for p in v["shipped"]["phases"]},
            "first_page_p50_ms_with": {p: v["with_single_col_idx"]["phases"][p]["client_ms"]["p50"]
                                       for p in v["with_single_col_idx"]["phases"]},
            "plans_with": {p: v["with_single_col_idx"]["phases"][p]["explain"]["plan"]
                           for p in v["with_single_col_idx"]["phases"]},
        }
    head["growth_tick_walk_with_single_col_idx"] = round(
        single[big]["tick_walk_ms_with"] / single[small]["tick_walk_ms_with"], 2)
    head["with_single_col_idx"] = single
    head["index_sizes_mb"] = result["sizes"][big].get("index_mb")
    head["mid_walk_full_sort_plans"] = {
        size: f"{st['full_sort_plans']}/{st['tries']}" for size in (small, big)
        for st in [result["sizes"][size]["variants"]["shipped"]["mid_walk_plan_stability"]]}
    result["headline"] = head
    result["target"] = "<= 5 ms and >= 50x faster than without the index, flat from 100k to 1M rows"
