"""The peers profile's reading of py-spy's collapsed stacks (``bench/peers/profile.py``): each
sample lands in the layer of its innermost frame's file and in the first phase of the job's life
its stack is inside, and the shares and ms/job follow from the counts. Hand-written stacks in
py-spy's ``raw`` format; nothing is sampled or timed here."""

from __future__ import annotations

from bench.peers.profile import PHASES, breakdown, layer_of, phase_of, profiled_systems

HEAD = 'process 10:"celery -A reconcile.celery_app worker --without-heartbeat"'
POOL = f"{HEAD};process 11:\"celery worker\";<module> (celery:6);Worker.workloop (billiard/pool.py:369)"
TASK = f"{POOL};build_tracer.<locals>.trace_task (celery/app/trace.py:564)"


def test_a_sample_is_in_the_layer_of_its_innermost_frame() -> None:
    create = ["create_step (reconcile/lifecycle/create.py:90)"]
    assert layer_of([*create, "Session.request (requests/sessions.py:651)"]) \
        == "HTTP client (requests, urllib3, http.client)"
    assert layer_of([*create, "Cursor.execute (psycopg/cursor.py:97)"]) == "psycopg"
    # a full path names the same layer as py-spy's short one
    assert layer_of(["x (/srv/app/.venv/lib/python3.11/site-packages/sqlalchemy/orm/session.py:1)"]) \
        == "SQLAlchemy"
    assert layer_of(create) == "the library (reconcile)"
    assert layer_of(["create_job (bench/peers/plain_celery.py:50)"]) == "the peer's own code"
    # a file whose name only contains a layer's (``myrequests/``) is not that layer
    assert layer_of(["f (myrequests/api.py:1)"]) == "other (the interpreter, stdlib)"
    assert layer_of(["Condition.wait (threading.py:331)"]) == "threads, queues"


def test_a_sample_is_in_the_first_phase_its_stack_is_inside() -> None:
    finalize_in_a_tick = [
        "poll_due (reconcile/tasks.py:200)", "poll_due (reconcile/lifecycle/batch.py:160)",
        "finalize_job_with_media (reconcile/lifecycle/finalize.py:78)",
        "safe_fetch (reconcile/media/fetch.py:170)"]
    assert phase_of(finalize_in_a_tick, "reconcile") == "finalize (download, store, complete)"
    assert phase_of(finalize_in_a_tick[:2], "reconcile") == "poll_due (claim, write back)"
    assert phase_of(["trace_task (celery/app/trace.py:1)", "create_step (x.py:1)"],
                    "reconcile") == "create"
    assert phase_of(["trace_task (celery/app/trace.py:1)"], "reconcile") \
        == "Celery: the task wrapper"
    assert phase_of(["create_job (bench/peers/plain_celery.py:50)"], "plain") == "create"
    assert phase_of(["poll_job (p.py:1)", "status (bench/peers/upstream.py:60)"], "plain") \
        == "status reads"
    assert phase_of(["something (x.py:1)"], "plain") == "other"


def test_the_breakdown_counts_shares_and_ms_per_job() -> None:
    raw = "\n".join([
        f"{TASK};create_step (reconcile/lifecycle/create.py:90);"
        "Session.request (requests/sessions.py:651) 30",
        f"{TASK};create_step (reconcile/lifecycle/create.py:90);"
        "Session.execute (sqlalchemy/orm/session.py:2555) 10",
        f"{HEAD};asynloop (celery/worker/loops.py:80);Hub.create_loop (kombu/asynchronous/hub.py:1) 10",
        "",  # a blank line and a line without a count are skipped
        f"{TASK};create_step (reconcile/lifecycle/create.py:90)",
    ])
    b = breakdown(raw, "reconcile", jobs=10, rate=50)
    assert b["samples"] == 50
    assert b["ms_per_job"] == 100.0  # 50 samples / 50 Hz = 1 s over 10 jobs
    assert b["phases"]["create"] == {"samples": 40, "share": 0.8, "ms_per_job": 80.0}
    assert b["phases"]["Celery: the consumer (main process)"]["samples"] == 10
    assert list(b["layers"]) == ["HTTP client (requests, urllib3, http.client)",
                                 "SQLAlchemy", "Celery, kombu, billiard"]
    assert b["layers"]["SQLAlchemy"]["share"] == 0.2


def test_every_phase_marker_names_a_function_that_exists() -> None:
    """A phase is found by function name: a renamed function would move its samples to
    "other" without a word. Each marker of the library's and the plain peer's phases is defined
    in its code."""
    import re
    from pathlib import Path

    from bench.peers.profile import PHASES

    root = Path(__file__).resolve().parents[2]
    sources = {"reconcile": [*(root / "reconcile").rglob("*.py")],
               "plain": [root / "bench/peers/plain_celery.py", root / "bench/peers/upstream.py",
                         root / "bench/peers/ledger.py"]}
    for family, phases in PHASES.items():
        text = "\n".join(p.read_text() for p in sources[family])
        for phase, markers in phases:
            for marker in markers:
                if marker == "_worker":  # concurrent.futures' thread, not ours
                    continue
                assert re.search(rf"^\s*def {re.escape(marker)}\(", text, re.M), (family, phase,
                                                                                  marker)


def test_every_celery_peer_is_profiled_with_its_own_app_and_phases() -> None:
    """The profiler finds a peer's worker by the app its system starts (``celery -A``) and
    reads its stacks with the phase markers of the system's family: each Celery peer has both,
    and the two reconcile modes share the library's app."""
    from bench.peers.run import systems

    names = profiled_systems()
    assert {"plain-celery", "reconcile-batch", "reconcile-chain"} <= set(names)
    assert "dbos" not in names  # not a Celery worker: nothing for py-spy to attach to by app
    for peer in systems(names):
        assert peer.celery_app and peer.family in PHASES, peer.name
    apps = {peer.name: peer.celery_app for peer in systems(names)}
    assert apps["reconcile-batch"] == apps["reconcile-chain"] != apps["plain-celery"]
