"""Figure 7 — the ledger audit on a 1M-transaction ledger: the full proof and ``--since``.

The ledger is built with set-based SQL (``generate_series``), consistent by construction:
``USERS`` users with one GRANT lot each, and jobs spread over 30 days, 60% committed whole
(USAGE + COMMIT), 20% committed for less (USAGE + COMMIT + RELEASE and its lot), 20% refunded
(USAGE + REFUND and its lot), with their usage logs and job rows — 1,000,000 transactions in all.
Then ``credits.audit`` runs in full (every row, the proof) and incrementally (``since`` one hour
ago: the users touched in the last hour), both must find the ledger clean; a corruption written
to one recent job must be found by both. Rows/s is transactions over the full audit's wall time.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

from .common import log, summary, throwaway_db

TXNS = 1_000_000
USERS = 50_000
QUICK_TXNS = 100_000
AMOUNT = 10  # per job; a commit for less commits 4 and releases 6
DAYS = 30


def _tables() -> dict[str, str]:
    from reconcile.db.models import CreditBalance, CreditLot, CreditTransaction, Job, UsageLog

    return {"t": CreditTransaction.__table__.name, "l": CreditLot.__table__.name,
            "b": CreditBalance.__table__.name, "j": Job.__table__.name,
            "u": UsageLog.__table__.name}


def _build_sql(jobs: int, users: int) -> list[str]:
    """The statements that write the ledger. Job ``n`` belongs to user ``n % users``; its class
    is ``n % 10``: 0–5 committed whole, 6–7 committed for less, 8–9 refunded."""
    t = _tables()
    span = DAYS * 86400.0
    job = "md5('job' || n)::uuid"
    user = f"md5('user' || (n % {users}))::uuid"
    at = f"now() - make_interval(secs => ({jobs} - n) * {span / jobs})"
    series = f"generate_series(1, {jobs}) AS n"
    return [
        f"INSERT INTO {t['t']} (id, user_id, job_id, type, amount, from_sub, from_topup, created_at) "
        f"SELECT 'grant-' || u, md5('user' || u)::uuid, NULL, 'GRANT', 1000000, 1000000, 0, "
        f"now() - interval '{DAYS + 1} days' FROM generate_series(0, {users - 1}) AS u",
        f"INSERT INTO {t['l']} (user_id, pool, kind, source_txn_id, amount, remaining_amount, created_at) "
        f"SELECT md5('user' || u)::uuid, 'sub', 'GRANT', 'grant-' || u, 1000000, 1000000, "
        f"now() - interval '{DAYS + 1} days' FROM generate_series(0, {users - 1}) AS u",
        f"INSERT INTO {t['j']} (id, user_id, job_type, status, progress, created_at, completed_at, "
        f"credits_actual, provider_kind, submission_state, reconcile_attempts, poll_generation, "
        f"poll_seq, settle_attempts, create_rate_limit_count, create_enqueue_count) "
        f"SELECT {job}, {user}, 'image', CASE WHEN n % 10 >= 8 THEN 'failed' ELSE 'completed' END, "
        f"100, {at}, {at}, CASE WHEN n % 10 >= 8 THEN 0 WHEN n % 10 >= 6 THEN 4 ELSE {AMOUNT} END, "
        f"'kie-standard', 'accepted', 0, 1, 0, 0, 0, 0 FROM {series}",
        f"INSERT INTO {t['u']} (id, job_id, user_id, status, credits, metadata, created_at) "
        f"SELECT md5('log' || n)::uuid, {job}, {user}, "
        f"CASE WHEN n % 10 >= 8 THEN 'refunded' ELSE 'committed' END, {AMOUNT}, "
        f"'{{\"from_sub\": {AMOUNT}, \"from_topup\": 0}}'::jsonb, {at} FROM {series}",
        f"INSERT INTO {t['t']} (id, user_id, job_id, type, amount, from_sub, from_topup, created_at) "
        f"SELECT 'job-usage:' || {job}, {user}, {job}, 'USAGE', {AMOUNT}, {AMOUNT}, 0, {at} FROM {series} "
        f"UNION ALL SELECT 'job-commit:' || {job}, {user}, {job}, 'COMMIT', "
        f"CASE WHEN n % 10 >= 6 THEN 4 ELSE {AMOUNT} END, "
        f"CASE WHEN n % 10 >= 6 THEN 4 ELSE {AMOUNT} END, 0, {at} FROM {series} WHERE n % 10 < 8 "
        f"UNION ALL SELECT 'job-release:' || {job}, {user}, {job}, 'RELEASE', 6, 6, 0, {at} "
        f"FROM {series} WHERE n % 10 IN (6, 7) "
        f"UNION ALL SELECT 'job-refund:' || {job}, {user}, {job}, 'REFUND', {AMOUNT}, {AMOUNT}, 0, {at} "
        f"FROM {series} WHERE n % 10 >= 8",
        f"INSERT INTO {t['l']} (user_id, pool, kind, source_txn_id, amount, remaining_amount, created_at) "
        f"SELECT {user}, 'sub', CASE WHEN n % 10 >= 8 THEN 'REFUND' ELSE 'RELEASE' END, "
        f"CASE WHEN n % 10 >= 8 THEN 'job-refund:' ELSE 'job-release:' END || {job} || ':sub', "
        f"CASE WHEN n % 10 >= 8 THEN {AMOUNT} ELSE 6 END, CASE WHEN n % 10 >= 8 THEN {AMOUNT} ELSE 6 END, "
        f"{at} FROM {series} WHERE n % 10 >= 6",
        # every job consumed its AMOUNT from the user's GRANT lot (the oldest: FIFO)
        f"UPDATE {t['l']} AS l SET remaining_amount = l.amount - c.used FROM ("
        f"SELECT {user} AS user_id, count(*) * {AMOUNT} AS used FROM {series} GROUP BY 1) AS c "
        f"WHERE l.user_id = c.user_id AND l.kind = 'GRANT'",
        f"INSERT INTO {t['b']} (user_id, sub, topup, updated_at) SELECT user_id, "
        f"sum(remaining_amount), 0, now() - interval '1 day' FROM {t['l']} GROUP BY user_id",
        f"ANALYZE {t['t']}", f"ANALYZE {t['l']}", f"ANALYZE {t['b']}", f"ANALYZE {t['j']}",
        f"ANALYZE {t['u']}",
    ]


def _jobs_for(txns: int, users: int) -> int:
    # 2.2 transactions per job on average (0.6 × 2 + 0.2 × 3 + 0.2 × 2), plus one GRANT per user
    return round((txns - users) / 2.2)


class Prebuilt:
    """The ledger built ahead, in a thread (``make bench`` builds it while figure 6 waits out its
    leases and ticks: setup overlapped with a figure that mostly sleeps); :func:`run` measures
    on it and drops it."""

    def __init__(self, quick: bool) -> None:
        import threading

        self.quick = quick
        self.error: BaseException | None = None
        self._stack = ExitStack()
        self._thread = threading.Thread(target=self._build, daemon=True, name="fig7-build")
        self._thread.start()

    def _build(self) -> None:
        try:
            self.url, self.libpq = self._stack.enter_context(throwaway_db("audit"))
            self.count, self.jobs, self.users, self.build_s = _build(self.libpq, self.quick)
        except BaseException as exc:  # re-raised by wait()
            self.error = exc

    def wait(self) -> None:
        self._thread.join()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self._thread.join()
        self._stack.close()


def _build(libpq: str, quick: bool) -> tuple[int, int, int, float]:
    import psycopg

    target = QUICK_TXNS if quick else TXNS
    users = USERS // 10 if quick else USERS
    jobs = _jobs_for(target, users)
    t0 = time.perf_counter()
    with psycopg.connect(libpq, autocommit=True) as conn:
        for stmt in _build_sql(jobs, users):
            conn.execute(stmt)  # type: ignore[arg-type]
        count = conn.execute(f"SELECT count(*) FROM {_tables()['t']}").fetchone()[0]  # type: ignore[index]
    build_s = time.perf_counter() - t0
    log(f"fig7: built {count:,} transactions ({jobs:,} jobs, {users:,} users) in {build_s:.1f}s")
    return count, jobs, users, build_s


def run(quick: bool = False, prebuilt: Prebuilt | None = None) -> dict[str, Any]:
    built = prebuilt or Prebuilt(quick)
    try:
        built.wait()
        out = _measure(built.url, built.libpq, built.count, built.jobs, built.users,
                       built.build_s)
    finally:
        built.close()
    out["built_ahead"] = prebuilt is not None
    return out


def _measure(url: str, libpq: str, count: int, jobs: int, users: int,
             build_s: float) -> dict[str, Any]:
    import psycopg

    from reconcile import credits
    from reconcile.db.session import make_engine, make_sessionmaker

    engine = make_engine(url, pool_size=1, max_overflow=0)
    sessions = make_sessionmaker(engine)
    now = datetime.now(UTC)
    since = now - timedelta(hours=1)

    def audit(**kwargs: Any) -> tuple[float, list[Any]]:
        with sessions() as s:
            t = time.perf_counter()
            found = credits.audit(s, now=now, **kwargs)
            return time.perf_counter() - t, found

    full_s, full_found = audit()
    inc = [audit(since=since) for _ in range(3)]
    with sessions() as s:
        touched = len(__import__("reconcile.audit", fromlist=["x"]).touched_users(s, since))
    # prove neither is vacuous: one recent job's usage log is corrupted
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f"UPDATE {_tables()['u']} SET credits = credits + 1 "  # type: ignore[arg-type]
                     f"WHERE job_id = md5('job' || {jobs})::uuid")
    _, full_bad = audit()
    _, inc_bad = audit(since=since)
    engine.dispose()
    inc_s = [s for s, _ in inc]
    return {
        "transactions": count, "jobs": jobs, "users": users, "build_seconds": round(build_s, 1),
        "full": {"seconds": round(full_s, 2), "rows_per_s": round(count / full_s),
                 "clean": full_found == []},
        "since_1h": {"seconds": summary(inc_s, 3), "users_touched": touched,
                     "clean": all(found == [] for _, found in inc)},
        "corruption_found": {"full": [d.kind for d in full_bad], "since_1h": [d.kind for d in inc_bad]},
        "speedup_since_vs_full": round(full_s / min(inc_s), 1),
    }


if __name__ == "__main__":  # python -m bench.fig_audit [--quick]: print the figure as JSON
    import json
    import sys

    print(json.dumps(run("--quick" in sys.argv), indent=1))
