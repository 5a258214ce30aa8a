"""Figure 4 — ledger throughput beside a ``pgbench -b simple-update`` baseline, same server,
same run, same client concurrency.

A cycle is two transactions through ``reconcile.credits`` on the library's own engine:
``reserve`` (what ``submit_job`` does inside its insert transaction), then ``commit`` (what
finalize does) or ``refund`` (what a failure settles). ``CLIENTS`` processes run cycles for
``SECONDS`` each, against one hot user (every client serialises on one balance row) or 1,000
users (a random one per cycle). Each user starts with one large GRANT lot. pgbench runs with the
same client count before and after the ledger runs; both runs are reported and their mean is the
baseline. Completed cycles are also bucketed per second: a curve that sinks over the run means a
cycle gets slower as the ledger grows.

A second, direct measurement: ``reserve`` latency for one user holding L open lots
(``remaining_amount > 0``; every refund adds one, and FIFO consumes the oldest first, so a user
with a large grant and many failed jobs accumulates them). Each reserve is rolled back, so L
stays fixed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import re
import subprocess
import time
import uuid
from typing import Any

from .common import log, throwaway_db

CLIENTS = 2  # = the cores here and the worker concurrency used elsewhere
SECONDS = 8.0  # per run (make bench keeps its total near 1 min)
USERS = 1000
AMOUNT = 10


def _pgbench_bin() -> str:
    import glob
    import shutil

    found = shutil.which("pgbench")
    if found:
        return found
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"))
    if not candidates:
        raise RuntimeError("pgbench not found (PATH or /usr/lib/postgresql/*/bin)")
    return candidates[-1]


def _pgbench(libpq: str, seconds: float, clients: int) -> dict[str, Any]:
    cmd = [_pgbench_bin(), "-b", "simple-update", "-c", str(clients), "-j", str(min(clients, 2)),
           "-T", str(int(seconds)), "-n", libpq]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    tps = float(re.search(r"tps = ([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    lat = re.search(r"latency average = ([0-9.]+) ms", out)
    return {"tps": round(tps, 1), "latency_ms": float(lat.group(1)) if lat else None,
            "command": " ".join(cmd[:-1]) + " <db>"}


def _client(url: str, users: list[str], settle: str, start_at: float, seconds: float,
            queue: Any) -> None:
    from sqlalchemy.exc import OperationalError

    from reconcile import credits
    from reconcile.db.session import make_engine, make_sessionmaker

    engine = make_engine(url, pool_size=1, max_overflow=0)
    sessions = make_sessionmaker(engine)
    ids = [uuid.UUID(u) for u in users]
    rng = random.Random(os.getpid())
    stamps: list[float] = []
    errors = 0
    with sessions() as warm:  # connect before the clock starts
        warm.connection()
    while time.time() < start_at:
        time.sleep(0.005)
    end = start_at + seconds
    cpu0 = time.process_time()
    while time.time() < end:
        user, job = rng.choice(ids), uuid.uuid4()
        try:
            with sessions.begin() as s:
                credits.reserve(s, user, job, AMOUNT)
            with sessions.begin() as s:
                if settle == "commit":
                    assert credits.commit(s, job)
                else:
                    assert credits.refund(s, job)
        except OperationalError:  # deadlock/serialization: count, go on
            errors += 1
            continue
        stamps.append(time.time() - start_at)
    cpu = time.process_time() - cpu0
    engine.dispose()
    queue.put((stamps, errors, cpu))


def _ledger_run(url: str, users: list[str], settle: str, seconds: float,
                clients: int) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    start_at = time.time() + 2.0
    procs = [ctx.Process(target=_client, args=(url, users, settle, start_at, seconds, queue))
             for _ in range(clients)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    stamps = sorted(t for r, _, _ in results for t in r)
    errors = sum(e for _, e, _ in results)
    cpu = sum(c for _, _, c in results)
    buckets = [0] * int(seconds)
    for t in stamps:
        if t < seconds:
            buckets[int(t)] += 1
    return {"cycles": len(stamps), "cycles_per_s": round(len(stamps) / seconds, 1),
            "errors": errors, "per_second": buckets,
            "client_cpu_ms_per_cycle": round(cpu / len(stamps) * 1000, 2) if stamps else None,
            "first_s_vs_last_s": round(buckets[-1] / buckets[0], 2) if buckets and buckets[0] else None}


def _open_lots(url: str, users: list[str]) -> dict[str, int]:
    from sqlalchemy import text

    from reconcile.db.session import make_engine

    engine = make_engine(url)
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT count(*), max(c) FROM (SELECT user_id, count(*) AS c FROM reconcile_credit_lots "
            "WHERE remaining_amount > 0 AND user_id = ANY(CAST(:users AS uuid[])) "
            "GROUP BY user_id) s"), {"users": users}).one()
    engine.dispose()
    return {"users_with_open_lots": int(row[0]), "max_open_lots_per_user": int(row[1] or 0)}


_LOTS_SQL = """
WITH u AS (SELECT CAST(:user AS uuid) AS id)
INSERT INTO reconcile_credit_lots (user_id, pool, kind, source_txn_id, amount, remaining_amount, created_at)
SELECT u.id, 'sub', CASE WHEN g = 1 THEN 'GRANT' ELSE 'REFUND' END, 'lots-' || u.id || '-' || g,
       CASE WHEN g = 1 THEN 1000000000 ELSE 10 END, CASE WHEN g = 1 THEN 1000000000 ELSE 10 END,
       now()
FROM u, generate_series(1, :n) AS g
"""


def _reserve_vs_lots(url: str, sizes: tuple[int, ...], runs: int) -> list[dict[str, Any]]:
    from sqlalchemy import text

    from reconcile import credits
    from reconcile.db.session import make_engine, make_sessionmaker

    from .common import summary

    engine = make_engine(url, pool_size=1, max_overflow=0)
    sessions = make_sessionmaker(engine)
    out = []
    for n in sizes:
        user = uuid.uuid4()
        with sessions.begin() as s:
            s.execute(text(_LOTS_SQL), {"user": str(user), "n": n})
            s.execute(text("INSERT INTO reconcile_credit_balances (user_id, sub, topup) "
                           "SELECT CAST(:u AS uuid), sum(remaining_amount), 0 FROM reconcile_credit_lots "
                           "WHERE user_id = CAST(:u AS uuid)"), {"u": str(user)})
        samples = []
        for i in range(runs + 3):
            session = sessions()
            t0 = time.perf_counter()
            credits.reserve(session, user, uuid.uuid4(), AMOUNT)
            took = (time.perf_counter() - t0) * 1000.0
            session.rollback()
            session.close()
            if i >= 3:
                samples.append(took)
        out.append({"open_lots": n, "reserve_ms": summary(samples, 2)})
        log(f"fig4: reserve with {n} open lots: p50 {out[-1]['reserve_ms']['p50']} ms")
    engine.dispose()
    return out


def _fresh_users(url: str, n: int) -> list[str]:
    """``n`` users with one large GRANT lot each, written set-based (``seed.add_users``: the
    same rows ``credits.grant`` writes; 1,000 grants one by one took 15–20 s on a loaded host)."""
    from reconcile.db.session import make_engine

    from .seed import add_users

    engine = make_engine(url)
    users = [uuid.uuid4() for _ in range(n)]
    with engine.begin() as conn:
        add_users(conn, users)
    engine.dispose()
    return [str(u) for u in users]


def run(quick: bool = False) -> dict[str, Any]:
    seconds = 4.0 if quick else SECONDS
    clients = CLIENTS
    result: dict[str, Any] = {"clients": clients, "seconds_per_run": seconds,
                              "amount_per_reservation": AMOUNT, "runs": {}, "pgbench": []}
    with throwaway_db("pgbench", migrate=False) as (_, pgb), throwaway_db("ledger") as (url, _):
        subprocess.run([_pgbench_bin(), "-i", "-s", "1", "-q", pgb], capture_output=True,
                       check=True)
        result["pgbench"].append(_pgbench(pgb, seconds, clients))
        log(f"fig4: pgbench simple-update (before): {result['pgbench'][-1]['tps']} tps")
        for users_label, n in (("hot_user", 1), ("1000_users", USERS)):
            for settle in ("commit", "refund"):
                users = _fresh_users(url, n)  # fresh users: every run starts with one lot each
                name = f"reserve+{settle}/{users_label}"
                entry = _ledger_run(url, users, settle, seconds, clients)
                entry.update(_open_lots(url, users) if settle == "refund" else {})
                result["runs"][name] = entry
                log(f"fig4: {name}: {entry['cycles_per_s']} cycles/s "
                    f"(last/first second {entry['first_s_vs_last_s']})")
        result["pgbench"].append(_pgbench(pgb, seconds, clients))
        result["reserve_vs_open_lots"] = _reserve_vs_lots(
            url, (1, 100, 1000) if quick else (1, 10, 100, 1000, 10000), 10 if quick else 30)
        log(f"fig4: pgbench simple-update (after): {result['pgbench'][-1]['tps']} tps")
    baseline = sum(p["tps"] for p in result["pgbench"]) / len(result["pgbench"])
    result["pgbench_tps_mean"] = round(baseline, 1)
    for entry in result["runs"].values():
        entry["ratio_to_pgbench"] = round(entry["cycles_per_s"] / baseline, 3)
        entry["txn_ratio_to_pgbench"] = round(2 * entry["cycles_per_s"] / baseline, 3)
    result["target"] = ">= 30% of the pgbench baseline"
    return result
