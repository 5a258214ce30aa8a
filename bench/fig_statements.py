"""Figure 5 — database statements per job on the happy path, and per idle sweep tick.

The library's own functions run in-process (``submit_job`` → ``create_step`` → ``poll_step`` …)
against PostgreSQL and the simulator, exactly the code a Celery task calls. A SQLAlchemy
``before_cursor_execute`` listener counts every statement, bucketed by step; the ``begin``
connection event counts transactions, and the pool's ``checkout`` event counts
connection checkouts (one more than ``db.session.PING_AFTER_IDLE`` after the connection's
previous checkout costs a ping round trip, which the cursor listener does not see). The
simulator's clock is stepped, so each poll sees the state the script says.
Chain mode steps one job's turns per kind; batch mode (the default) polls a batch of jobs
together, whose shared claim and set-based write are divided among them.
(The counter is ``reconcile.testing.counting.Counting``, shared with
``tests/integration/test_round_trips.py``.)
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

from reconcile.testing.counting import Counting

from .common import log, throwaway_db

KINDS = (("kie-standard", "m"), ("replicate-prediction", "o/m:v"), ("fal-queue", "fal-ai/flux/dev"))
RUNNING_POLLS = 3


def _one_job(rt: Any, sim: Any, clock: list[float], counting: Counting, kind: str,
             model: str) -> dict[str, Any]:
    from reconcile import credits, lifecycle
    from reconcile.db.models import Job
    from reconcile.testing.simulator import Script

    user = uuid.uuid4()
    counting.step = "setup"
    with rt.sessions.begin() as s:
        credits.grant(s, user, "sub", 1000, f"grant-{user}")
    job_id = uuid.uuid4()
    sim.script(str(job_id), Script(timeline=((0.0, "queued"), (1.0, "running"),
                                             (10.0, "succeeded")), outputs=1))
    polls: list[tuple[int, int]] = []
    creates: list[uuid.UUID] = []
    rt.enqueue_create = lambda jid, countdown=0.0: creates.append(jid)
    rt.enqueue_poll = lambda jid, g, s, countdown: polls.append((g, s))

    counting.step = "submit"
    lifecycle.submit_job(rt, user, kind, model, {"prompt": "a cat"}, 40, job_type="image",
                         job_id=job_id)
    counting.step = "create"
    clock[0] = 0.0
    assert lifecycle.create_step(rt, creates.pop()).action == "accepted"
    steps: list[dict[str, Any]] = []
    times = [2.0 + 2.0 * i for i in range(RUNNING_POLLS)] + [11.0]
    outcome = ""
    for i, at in enumerate(times):
        clock[0] = at
        generation, seq = polls.pop()
        counting.step = f"poll{i + 1}"
        outcome = lifecycle.poll_step(rt, job_id, generation, seq)
        steps.append({"step": counting.step, "outcome": outcome, **counting.of(counting.step)})
    counting.step = "check"
    with rt.sessions() as s:
        job = s.get(Job, job_id)
        assert job is not None and job.status == "completed", (job and job.status, outcome)
    running = [s["statements"] for s in steps if s["outcome"] == "in_flight"]
    per_poll = max(set(running), key=running.count) if running else 0
    total = sum(counting.statements[k] for k in ("submit", "create")) + sum(
        s["statements"] for s in steps)
    outside = total - per_poll * len(steps)
    running_txns = [s["transactions"] for s in steps if s["outcome"] == "in_flight"]
    per_poll_txns = max(set(running_txns), key=running_txns.count) if running_txns else 0
    txns_total = sum(counting.transactions[k] for k in ("submit", "create")) + sum(
        s["transactions"] for s in steps)
    final = steps[-1]
    return {
        "kind": kind, "submit": counting.of("submit"), "create": counting.of("create"),
        "polls": steps, "statements_per_running_poll": per_poll,
        "statements_final_poll": final["statements"],
        "statements_total": total,
        "statements_outside_polls": outside,
        "outside_breakdown": {"submit": counting.statements["submit"],
                              "create": counting.statements["create"],
                              "finalize (final poll minus one poll)": final["statements"] - per_poll},
        "transactions_total": txns_total,
        "transactions_per_running_poll": per_poll_txns,
        "transactions_outside_polls": txns_total - per_poll_txns * len(steps),
        "checkouts_total": sum(counting.checkouts[k] for k in ("submit", "create"))
        + sum(s["checkouts"] for s in steps),
        "statement_texts": {k: counting.samples.get(k, []) for k in
                            ("submit", "create", "poll1", f"poll{len(steps)}")},
    }


BATCH_JOBS = 8
BATCH_TIMES = (2.0, 4.0, 6.0, 11.0)  # the rounds' clock: three running reads, then done


def _batch_jobs(rt: Any, sim: Any, clock: list[float], counting: Counting) -> dict[str, Any]:
    """Batch mode: ``BATCH_JOBS`` kie-standard jobs submitted and created one by one, then
    polled together by ``poll_due`` rounds (every row made due before each). A batch shares
    its claim and its set-based write, so the per-job figures are the batch's totals ÷ jobs."""
    from reconcile import credits, lifecycle
    from reconcile.jobstore import make_due_at
    from reconcile.lifecycle import batch as batch_poll
    from reconcile.testing.simulator import Script

    creates: list[uuid.UUID] = []
    rt.enqueue_create = lambda jid, countdown=0.0: creates.append(jid)
    ids = []
    for _ in range(BATCH_JOBS):
        user, job_id = uuid.uuid4(), uuid.uuid4()
        counting.step = "setup"
        with rt.sessions.begin() as s:
            credits.grant(s, user, "sub", 1000, f"grant-{user}")
        sim.script(str(job_id), Script(timeline=((0.0, "queued"), (1.0, "running"),
                                                 (10.0, "succeeded")), outputs=1))
        counting.step = "submit"
        lifecycle.submit_job(rt, user, "kie-standard", "m", {"prompt": "a cat"}, 40,
                             job_type="image", job_id=job_id)
        counting.step = "create"
        clock[0] = 0.0
        assert lifecycle.create_step(rt, creates.pop()).action == "accepted"
        ids.append(job_id)
    rounds = []
    for n, at in enumerate(BATCH_TIMES):
        clock[0] = at
        counting.step = "setup"
        with rt.sessions.begin() as s:
            for job_id in ids:
                make_due_at(s, job_id, rt.now())
        counting.step = f"round{n}"
        report = batch_poll.poll_due(rt, budget=60)
        rounds.append({"round": counting.step, "outcomes": dict(report.outcomes),
                       **counting.of(counting.step)})
    assert rounds[-1]["outcomes"] == {"completed": BATCH_JOBS}, rounds[-1]
    out: dict[str, Any] = {"jobs": BATCH_JOBS, "rounds": rounds,
                           "statement_texts": {k: counting.samples.get(k, [])[:4 + BATCH_JOBS]
                                               for k in ("round0", f"round{len(rounds) - 1}")}}
    for what in ("statements", "transactions"):
        total = (getattr(counting, what)["submit"] + getattr(counting, what)["create"]
                 + sum(r[what] for r in rounds))
        per_round = rounds[0][what]
        out[f"{what}_per_job_per_poll"] = round(per_round / BATCH_JOBS, 3)
        out[f"{what}_per_job_outside_polls"] = round(
            (total - per_round * len(rounds)) / BATCH_JOBS, 3)
    return out


def run(quick: bool = False) -> dict[str, Any]:
    from reconcile.db.session import make_engine, make_sessionmaker
    from reconcile.runtime import Runtime
    from reconcile.storage import LocalStorage
    from reconcile.sweep import sweep
    from reconcile.testing.simulator import Simulator

    clock = [0.0]
    result: dict[str, Any] = {"method": __doc__.strip().split("\n\n")[1].replace("\n", " "),
                              "kinds": {}}
    with throwaway_db("stmts") as (url, _), tempfile.TemporaryDirectory() as tmp, \
            Simulator(clock=lambda: clock[0]) as sim:
        engine = make_engine(url)
        # once per engine, at a process's start (Runtime.from_settings' table check): what the
        # database assigns on usage_logs.id, read before the per-job counts (as the test does)
        from reconcile.db.contract import usage_log_ids_assigned

        with engine.connect() as conn:
            usage_log_ids_assigned(conn)
        counting = Counting(engine)
        # the chain's turns, one poll message each, per kind; then batch mode (_batch_jobs)
        rt = Runtime(settings=sim.settings(webhook_base_url="https://platform.example/hooks",
                                           poll_mode="chain"),
                     sessions=make_sessionmaker(engine), storage=LocalStorage(Path(tmp) / "media"))
        for kind, model in KINDS:
            counting.clear()
            result["kinds"][kind] = _one_job(rt, sim, clock, counting, kind, model)
            r = result["kinds"][kind]
            log(f"fig5: {kind}: outside polls {r['statements_outside_polls']} statements in "
                f"{r['transactions_outside_polls']} transactions, per poll "
                f"{r['statements_per_running_poll']} in {r['transactions_per_running_poll']}, "
                f"total {r['statements_total']} in {r['transactions_total']}")
        counting.clear()
        batch = Runtime(settings=sim.settings(webhook_base_url="https://platform.example/hooks",
                                              poll_mode="batch"),
                        sessions=make_sessionmaker(engine),
                        storage=LocalStorage(Path(tmp) / "media"))
        b = result["batch"] = _batch_jobs(batch, sim, clock, counting)
        log(f"fig5: batch ({b['jobs']} kie-standard jobs per batch): outside polls "
            f"{b['statements_per_job_outside_polls']} statements in "
            f"{b['transactions_per_job_outside_polls']} transactions per job, per poll "
            f"{b['statements_per_job_per_poll']} in {b['transactions_per_job_per_poll']}")
        # an idle system: nothing in flight, nothing unsettled (completed jobs of history)
        ticks = []
        for i in range(3):
            counting.step = f"sweep{i}"
            report = sweep(rt)
            ticks.append({"scanned": report.scanned, **counting.of(counting.step)})
        result["idle_sweep_tick"] = {"ticks": ticks,
                                     "statements": ticks[-1]["statements"],
                                     "transactions": ticks[-1]["transactions"],
                                     "checkouts": ticks[-1]["checkouts"],
                                     "statement_texts": counting.samples.get("sweep2", [])}
        log(f"fig5: idle sweep tick: {ticks[-1]['statements']} statements")
        engine.dispose()
    head = result["kinds"]["kie-standard"]
    b = result["batch"]
    result["by_mode"] = {
        "chain": {"outside_polls": head["statements_outside_polls"],
                  "per_poll": head["statements_per_running_poll"],
                  "transactions_outside_polls": head["transactions_outside_polls"],
                  "transactions_per_poll": head["transactions_per_running_poll"]},
        "batch": {"outside_polls": b["statements_per_job_outside_polls"],
                  "per_poll": b["statements_per_job_per_poll"],
                  "transactions_outside_polls": b["transactions_per_job_outside_polls"],
                  "transactions_per_poll": b["transactions_per_job_per_poll"]}}
    result["headline"] = {
        **result["by_mode"]["chain"],
        "idle_sweep_tick": result["idle_sweep_tick"]["statements"],
        "target_outside_polls": 15,
        "target_transactions_outside_polls": 5,
    }
    return result
