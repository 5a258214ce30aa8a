"""``make bench-profile``: a cProfile of the hot process of every figure whose aim is missed
(issue 16: each miss explained by a profile, not a guess). Separate from ``make bench`` (≈ 3 min
more than its 15-minute budget allows); writes ``bench/results/profiles/<name>.txt`` (top
functions by cumulative and by self time, and the time by layer) and ``profiles.json``, which
``latest.md`` links and summarises.

Each profile runs the library's own code in this process (no Celery between), on the same
fixtures as its figure:

* ``poll_chain`` — chain-mode poll turns (``lifecycle.poll_step``), 2,000 kie-standard jobs in
  flight: figure 3's chain mode and the CPU per in-flight poll;
* ``poll_batch`` — ``batch_poll.poll_due`` over the same 2,000 (figure 3's batch mode, the reads);
* ``drain`` — ``sweep.reconcile_job`` on stale jobs whose upstream succeeded (figure 2; also the
  finalize each batch completion runs inside ``poll_due``);
* ``ledger_hot_user`` / ``ledger_1000_users`` — reserve + commit/refund cycles (figure 4), once
  with a CPU timer and once with a wall timer (the round trips and lock waits show there).

    .venv/bin/python -m bench.profile_run [--only poll,drain,ledger] [--jobs 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .common import log, throwaway_db
from .profiles import profiled

OUT = Path(__file__).resolve().parent / "results" / "profiles"


def polls(out: Path, jobs: int) -> dict[str, Any]:
    from . import poll_modes

    result = poll_modes.run(jobs=jobs, seconds=16.0, profile=str(out))
    return {f"poll_{mode}": {**result[mode].pop("profile"), "unprofiled": result[mode]}
            for mode in ("chain", "batch")}


def drain(out: Path, n: int = 200) -> dict[str, Any]:
    from reconcile.sweep import reconcile_job

    from .fig_drain import stale_rig

    with stale_rig(n) as (_, rt, ids):

        def work() -> int:
            for j in ids:
                reconcile_job(rt, j)
            return n

        head = profiled(work, out / "drain.txt",
                        f"sweep.reconcile_job on {n} stale kie-standard jobs whose upstream "
                        "succeeded (figure 2's per-job work; no Celery)", unit="job")
    return {"drain": head}


def ledger(out: Path, cycles: int = 400) -> dict[str, Any]:
    from reconcile import credits
    from reconcile.db.session import make_engine, make_sessionmaker

    from .fig_ledger import AMOUNT, _fresh_users

    heads: dict[str, Any] = {}
    with throwaway_db("ledger_profile") as (url, _):
        for shape, n_users in (("hot_user", 1), ("1000_users", 1000)):
            users = [uuid.UUID(u) for u in _fresh_users(url, n_users)]
            engine = make_engine(url, pool_size=1, max_overflow=0)
            sessions = make_sessionmaker(engine)
            rng = random.Random(1)

            def work(users: list[uuid.UUID] = users, sessions: Any = sessions,
                     rng: random.Random = rng) -> int:
                for i in range(cycles):
                    user, job = rng.choice(users), uuid.uuid4()
                    with sessions.begin() as s:
                        credits.reserve(s, user, job, AMOUNT)
                    with sessions.begin() as s:
                        assert (credits.commit if i % 2 == 0 else credits.refund)(s, job)
                return cycles

            with sessions() as warm:
                warm.connection()
            for timer in ("cpu", "wall"):
                heads[f"ledger_{shape}_{timer}"] = profiled(
                    work, out / f"ledger_{shape}_{timer}.txt",
                    f"ledger cycles (reserve + commit / refund alternately), {shape.replace('_', ' ')}, "
                    f"one client in-process, {timer} timer (figure 4)", unit="cycle",
                    wall_timer=timer == "wall")
            engine.dispose()
    return heads


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_run")
    parser.add_argument("--only", default="poll,drain,ledger")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs in flight for the polls")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    one = os.getloadavg()[0]
    result: dict[str, Any] = {"date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S"),
                              "loadavg_1m_start": round(one, 2), "profiles": {}}
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    for name in wanted:
        log(f"=== profile {name}")
        t0 = time.monotonic()
        part = {"poll": lambda: polls(out, args.jobs), "drain": lambda: drain(out),
                "ledger": lambda: ledger(out)}[name]()
        result["profiles"].update(part)
        log(f"=== profile {name} done in {time.monotonic() - t0:.1f}s")
    result["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    path = out / "profiles.json"
    old = json.loads(path.read_text()) if path.exists() and wanted != ["poll", "drain", "ledger"] \
        else {"profiles": {}}
    old["profiles"].update(result.pop("profiles"))
    old.update(result)
    path.write_text(json.dumps(old, indent=1, default=str) + "\n")
    log(f"wrote {path} ({result['wall_seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
