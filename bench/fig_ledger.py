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

The ledger's server side alone: the same two functions (``reconcile_ledger_reserve``, then
``reconcile_ledger_commit``, each in its own transaction, with the arguments the library passes)
driven by pgbench's C client instead of Python, same clients and seconds. Its cycles/s is the
ceiling a free client would reach; the Python runs' distance to it is the client's share. Between
the two, the same statements from a lean Python client (psycopg alone, ``conn.transaction()``, no
SQLAlchemy): what is left between it and the library's runs is the Session and execution
machinery a platform's caller goes through.

A further direct measurement: ``reserve`` latency for one user holding L open lots
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


def _run_clients(target: Any, args: tuple[Any, ...], seconds: float, clients: int) -> list[Any]:
    """``clients`` forked processes of ``target(*args, start_at, seconds, queue)``, started
    together 2 s from now; what each put on the queue."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    start_at = time.time() + 2.0
    procs = [ctx.Process(target=target, args=(*args, start_at, seconds, queue))
             for _ in range(clients)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return results


def _ledger_run(url: str, users: list[str], settle: str, seconds: float,
                clients: int) -> dict[str, Any]:
    results = _run_clients(_client, (url, users, settle), seconds, clients)
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


# the functions' cycle for pgbench (``-f``): ``:k`` picks the user (the ``_pgbench_user`` ids),
# ``:a``/``:b`` make the job's uuid; the text ids are the library's (credits._base)
_FUNCTIONS_SCRIPT = """\\set k random(1, {users})
\\set a random(1, 4611686018427387903)
\\set b random(1, 4611686018427387903)
BEGIN;
{reserve};
COMMIT;
BEGIN;
{commit};
COMMIT;
"""
# the cycle's two calls, with the library's arguments: {user} and {job} are SQL expressions (the
# pgbench variables, or the lean client's parameters)
_RESERVE_CALL = """SELECT r_inserted FROM reconcile_ledger_reserve({user}, {job}, {amount}::bigint,
  'job-usage:' || {job}, now(), {log_id})"""
_COMMIT_CALL = """SELECT r_committed FROM reconcile_ledger_commit({job}, now(), 'job-usage:' || {job},
  'job-refund:' || {job}, NULL::bigint, 'job-commit:' || {job}, 'job-release:' || {job},
  'job-release:' || {job} || ':sub', 'job-release:' || {job} || ':topup', NULL, NULL)"""


def _calls(user: str, job: str, assigned: bool) -> tuple[str, str]:
    """The reserve and the commit of one cycle, as pgbench's script and the lean client run them
    (``assigned``: the database assigns ``usage_logs.id``, :func:`_log_ids_assigned`)."""
    log_id = "NULL::uuid" if assigned else "gen_random_uuid()"
    return (_RESERVE_CALL.format(user=user, job=job, amount=AMOUNT, log_id=log_id),
            _COMMIT_CALL.format(job=job))


def _log_ids_assigned(url: str) -> bool:
    """Whether the database assigns ``usage_logs.id`` (the reserve function is then given no id)."""
    from reconcile.db.contract import usage_log_ids_assigned
    from reconcile.db.session import make_engine

    engine = make_engine(url)
    with engine.connect() as conn:
        assigned = usage_log_ids_assigned(conn)
    engine.dispose()
    return assigned


_USER_PREFIX = "b1ed6e70-0000-4000-8{run:03x}-"  # a run's users: fresh, as the Python runs'


def _pgbench_user(prefix: str, k: int) -> uuid.UUID:
    return uuid.UUID(f"{prefix}{k:012x}")


def _functions_under_pgbench(url: str, libpq: str, n_users: int, seconds: float,
                             clients: int, run: int, assigned: bool) -> dict[str, Any]:
    """reserve + commit cycles/s through the ledger's functions with pgbench as the client."""
    import tempfile

    from reconcile.db.session import make_engine

    from .seed import add_users

    prefix = _USER_PREFIX.format(run=run)
    engine = make_engine(url)
    with engine.begin() as conn:
        add_users(conn, [_pgbench_user(prefix, k) for k in range(1, n_users + 1)])
    engine.dispose()
    job = "(lpad(to_hex(:a), 16, '0') || lpad(to_hex(:b), 16, '0'))::uuid"
    reserve, commit = _calls(f"('{prefix}' || lpad(to_hex(:k), 12, '0'))::uuid", job, assigned)
    script = _FUNCTIONS_SCRIPT.format(users=n_users, reserve=reserve, commit=commit)
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as f:
        f.write(script)
        f.flush()
        cmd = [_pgbench_bin(), "-n", "-f", f.name, "-c", str(clients), "-j", str(min(clients, 2)),
               "-T", str(int(seconds)), libpq]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pgbench over the ledger functions failed: {done.stderr[-2000:]}")
    tps = float(re.search(r"tps = ([0-9.]+)", done.stdout).group(1))  # type: ignore[union-attr]
    from sqlalchemy import text

    engine = make_engine(url)
    with engine.connect() as conn:  # every cycle reserved and committed (no silent no-op)
        usage, commits = conn.execute(text(
            "SELECT count(*) FILTER (WHERE type = 'USAGE'), count(*) FILTER (WHERE type = 'COMMIT') "
            "FROM reconcile_credit_transactions WHERE user_id::text LIKE :prefix"),
            {"prefix": prefix + "%"}).one()
    engine.dispose()
    if not usage or usage != commits:
        raise RuntimeError(f"pgbench over the ledger functions: {usage} reserves, {commits} "
                           "commits (expected as many, more than none)")
    return {"cycles_per_s": round(tps, 1), "users": n_users, "reserves_checked": int(usage),
            "command": " ".join(cmd[:-1]).replace(f.name, "<cycle.sql>") + " <db>"}


def _lean_client(libpq: str, users: list[str], assigned: bool, start_at: float, seconds: float,
                 queue: Any) -> None:
    """pgbench's cycle from Python with psycopg alone: the same two calls, each in its own
    transaction (BEGIN, the call, COMMIT), the arguments bound as parameters."""
    import psycopg

    reserve, commit = _calls("%(u)s::uuid", "%(j)s::uuid", assigned)
    rng = random.Random(os.getpid())
    done, errors = 0, 0
    with psycopg.connect(libpq) as conn:
        while time.time() < start_at:
            time.sleep(0.005)
        end = start_at + seconds
        cpu0 = time.process_time()
        while time.time() < end:
            params = {"u": uuid.UUID(rng.choice(users)), "j": uuid.uuid4()}
            try:
                with conn.transaction():
                    inserted = conn.execute(reserve, params).fetchone()
                with conn.transaction():
                    committed = conn.execute(commit, params).fetchone()
            except psycopg.OperationalError:
                errors += 1
                continue
            if not (inserted and inserted[0] and committed and committed[0] == AMOUNT):
                raise RuntimeError(f"the lean client's cycle wrote nothing: {inserted} {committed}")
            done += 1
        cpu = time.process_time() - cpu0
    queue.put((done, errors, cpu))


def _lean_python(url: str, libpq: str, n_users: int, seconds: float, clients: int,
                 assigned: bool) -> dict[str, Any]:
    """reserve + commit cycles/s through the functions from ``clients`` lean Python clients."""
    users = _fresh_users(url, n_users)
    results = _run_clients(_lean_client, (libpq, users, assigned), seconds, clients)
    done = sum(d for d, _, _ in results)
    return {"cycles_per_s": round(done / seconds, 1), "errors": sum(e for _, e, _ in results),
            "client_cpu_ms_per_cycle": round(sum(c for _, _, c in results) / done * 1000, 2)
            if done else None, "client": "psycopg alone, conn.transaction() per call"}


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
    with throwaway_db("pgbench", migrate=False) as (_, pgb), throwaway_db("ledger") as (url, libpq):
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
        result["functions_under_pgbench"] = {}
        assigned = _log_ids_assigned(url)
        for run, (users_label, n) in enumerate((("hot_user", 1), ("1000_users", USERS))):
            entry = _functions_under_pgbench(url, libpq, n, seconds, clients, run, assigned)
            result["functions_under_pgbench"][f"reserve+commit/{users_label}"] = entry
            log(f"fig4: reserve+commit/{users_label} through pgbench (no Python): "
                f"{entry['cycles_per_s']} cycles/s")
        result["functions_lean_python"] = {}
        for users_label, n in (("hot_user", 1), ("1000_users", USERS)):
            entry = _lean_python(url, libpq, n, seconds, clients, assigned)
            result["functions_lean_python"][f"reserve+commit/{users_label}"] = entry
            log(f"fig4: reserve+commit/{users_label} from psycopg alone: "
                f"{entry['cycles_per_s']} cycles/s")
        result["pgbench"].append(_pgbench(pgb, seconds, clients))
        result["reserve_vs_open_lots"] = _reserve_vs_lots(
            url, (1, 100, 1000) if quick else (1, 10, 100, 1000, 10000), 10 if quick else 30)
        log(f"fig4: pgbench simple-update (after): {result['pgbench'][-1]['tps']} tps")
    baseline = sum(p["tps"] for p in result["pgbench"]) / len(result["pgbench"])
    result["pgbench_tps_mean"] = round(baseline, 1)
    for entry in result["runs"].values():
        entry["ratio_to_pgbench"] = round(entry["cycles_per_s"] / baseline, 3)
    for entry in (*result["runs"].values(), *result["functions_lean_python"].values(),
                  *result["functions_under_pgbench"].values()):  # a cycle is 2 transactions
        entry["txn_ratio_to_pgbench"] = round(2 * entry["cycles_per_s"] / baseline, 3)
    for name, entry in result["functions_under_pgbench"].items():
        python = result["runs"].get(name)
        if python and entry["cycles_per_s"]:  # the Python runs' share of this ceiling
            python["share_of_functions_ceiling"] = round(
                python["cycles_per_s"] / entry["cycles_per_s"], 3)
    result["target"] = ">= 30% of the pgbench baseline"
    return result
