"""Hostile ids, redirects and replays: a redirect cannot escape the sync deadline, a hostile
task id is held for an operator, a late watchdog never shuts the next call's connection, a
replayed signed webhook never gives an uncertain job another job's task. On PostgreSQL with
the shipped simulator and loopback servers. Every test here was written as a REPRODUCER and
failed on main at acd9c7e. Findings 1-3 still fail on main at 45045b3; the fix commit after each
on branch atk11 makes it pass. Finding 4 was fixed on main meanwhile (i11c's evidence binding,
reconcile/evidence.py then, reconcile/jobstore/evidence.py since the layout move): its test
passes on 45045b3 and stays as a regression guard."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle, sync
from reconcile.db.models import CreditAnomaly
from reconcile.states import MAX_ATTEMPTS
from reconcile.testing.simulator import Script, Simulator
from tests.integration._sweep_helpers import World
from tests.integration.test_lifecycle_sync import Trickler

RUNS_FOREVER = ((0.0, "queued"), (1.0, "running"), (10.0**6, "succeeded"))


class Redirector:
    """A loopback 'provider' that answers every POST with a 307 to ``target`` (another port on
    127.0.0.1: another origin, so another requests adapter). Records the headers it saw."""

    def __init__(self, target: str) -> None:
        seen = self.seen = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.set()
                self.send_response(307)
                self.send_header("Location", target + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_reproducer_a_redirect_escapes_the_sync_deadline(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """REPRODUCER (atk11 finding 1, hole 7's watchdog). The provider answers the sync POST with
    a 307 to another origin; ``requests`` follows it (``send_once`` did not refuse redirects)
    through the session's default adapter, which ``deadline.prepare`` never mounted, so the
    redirected exchange's socket is not watched: a target that trickles its answer keeps the
    call running past the total deadline (and past the claim lease, where the sweep fails and
    refunds a call that is still running). The POST body (and ``x-api-key``, which requests
    only strips for ``Authorization``) also reaches the other origin. Expected: a sync call
    never follows a redirect — the 3xx is the answer, the job fails and is refunded, and
    nothing reaches the redirect target."""
    target = Trickler(headers=False, padding=100, gap=0.02)
    reached = threading.Event()
    trickle = target.server.RequestHandlerClass

    class Counted(trickle):  # type: ignore[misc,valid-type]
        def do_POST(self) -> None:  # noqa: N802
            reached.set()
            super().do_POST()

    target.server.RequestHandlerClass = Counted
    front = Redirector(target.url)
    try:
        w = World(db, simulator, tmp_path, anthropic_base_url=front.url, time_scale=0.01)
        job_id = w.submit("anthropic-sync")
        done = sync.run_sync(w.rt, job_id)
        assert front.seen.is_set()
        assert done.status == "failed" and done.credits_actual == 0, done.error_message
        assert w.log_status(job_id) == "refunded"
        # on main: the trickling target got the POST and finished its whole (~5 s) answer,
        # nobody cut it at the 2.4 s deadline
        assert not reached.is_set(), \
            "the sync call followed the redirect to another origin, outside the deadline"
    finally:
        front.close()
        target.close()


def test_reproducer_a_hostile_task_id_is_held_for_an_operator_not_a_silent_error_loop(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """REPRODUCER (atk11 finding 2). The provider accepts the create (it is billed) and names
    its task with an id PostgreSQL cannot store (a NUL byte: text cannot hold one). On main
    ``save_task_id`` raises ``DataError`` out of the create step; once the claim expires the sweep makes the
    job ``uncertain``, finds the same id in the listing on every evidence attempt and fails to
    adopt it: ``errors=1`` every tick, attempts past MAX_ATTEMPTS (24 of 18 seen) and never the
    ``uncertain_unresolved`` anomaly, so the reservation is held with no operator signal.
    Expected: the answer is refused before it reaches the database, the job is ``uncertain``
    at once (never refunded: the create was accepted), the listing's unusable id is no
    evidence, and at MAX_ATTEMPTS the operator gets the ``uncertain_unresolved`` anomaly."""
    w = World(db, simulator, tmp_path)
    real = simulator.new_id
    monkeypatch.setattr(simulator, "new_id",
                        lambda n, *a: "bad\x00" + real(n, *a))
    job_id = w.submit("replicate-prediction")
    outcome = lifecycle.create_step(w.rt, job_id)
    assert outcome.action == "uncertain"
    job = w.job(job_id)
    assert (job.status, job.submission_state, job.provider_task_id) == ("pending", "uncertain", None)
    errors = 0
    for _ in range(MAX_ATTEMPTS + 2):
        w.clock.advance(minutes=6)
        errors += w.tick().errors
    job = w.job(job_id)
    assert errors == 0
    assert (job.status, job.submission_state, job.credits_actual) == ("pending", "uncertain", None)
    assert w.log_status(job_id) == "reserved"  # an accepted create is never refunded blindly
    with w.db() as s:
        kinds = s.execute(select(CreditAnomaly.kind)
                          .where(CreditAnomaly.job_id == job_id)).scalars().all()
    assert "uncertain_unresolved" in kinds
    assert simulator.creates(str(job_id)) == 1


MESSAGE = (b'{"id": "msg_1", "type": "message", "model": "claude-x", "stop_reason": "end_turn", '
           b'"content": [{"type": "text", "text": "hello"}]}')


def test_reproducer_a_late_watchdog_shuts_the_pooled_connection_of_the_next_call(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """REPRODUCER (atk11 finding 3, hole 7's watchdog). Call A reuses a kept-alive connection,
    so its watch holds that connection's socket itself (not a dup it closes at the end). A's
    deadline fires just as A finishes, and ``expire()`` runs after A returned, while call B (the next request on the same client, here another
    job) is using the same pooled connection. On main it shuts B's socket: B's answer never
    arrives although the provider received the request (billed), and B is failed + refunded.
    Expected: a watch whose exchange ended shuts nothing."""
    from reconcile.providers import deadline

    # the watchdog as it can lose the race: a deadline that passes just as its exchange ends
    # fires whenever the watchdog thread runs — possibly after ``bounded()`` returned. Here the
    # watchdog never fires by itself and the test decides when each watch expires.
    scheduled: list[Any] = []
    monkeypatch.setattr(deadline._WATCHDOG, "schedule", lambda seconds, watch: scheduled.append(watch))
    requests_seen: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            requests_seen.append(1)
            if len(requests_seen) == 3:  # call B is on the wire: A's (and the warm call's)
                for watch in scheduled[:-2]:  # late deadlines fire now; B's own two are the last
                    watch.expire()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(MESSAGE)))
            self.end_headers()
            self.wfile.write(MESSAGE)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        w = World(db, simulator, tmp_path,
                  anthropic_base_url=f"http://127.0.0.1:{server.server_address[1]}")
        warm, a, b = (w.submit("anthropic-sync") for _ in range(3))
        assert sync.run_sync(w.rt, warm).status == "completed"  # opens the pooled connection
        assert sync.run_sync(w.rt, a).status == "completed"  # reuses it
        done = sync.run_sync(w.rt, b)
        assert len(requests_seen) == 3  # the provider got (and billed) B's request
        assert (done.status, done.credits_actual) == ("completed", 40), done.error_message
    finally:
        server.shutdown()
        server.server_close()


def test_reproducer_a_replayed_signed_webhook_never_gives_an_uncertain_job_another_jobs_task(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> None:
    """REPRODUCER (atk11 finding 4, "ids of another job"). Replicate signs the delivery body,
    not the URL, and the job id rides in the URL's query string: job B's genuine, signed
    delivery posted to job A's callback URL (``?job_id=A``) verifies, and is stored as evidence
    for A. A is ``uncertain``; on main the sweep adopts B's prediction for A without reading
    it (only KIE's evidence is checked against the task's echo), so two jobs poll one paid
    task: A is charged for B's result and its user receives B's output. Expected: the task is
    read first, and a task whose own ``webhook`` names another job is no evidence for A.
    (Failed on acd9c7e; passes since main merged i11c's ``reconcile.jobstore.evidence`` binding.)"""
    from reconcile.testing.sim_signing import replicate_headers
    from reconcile.webhook_ingest import handle_webhook

    w = World(db, simulator, tmp_path)
    b = w.accept("replicate-prediction", Script(timeline=RUNS_FOREVER))
    b_task = w.job(b).provider_task_id
    a = w.submit("replicate-prediction")
    w.set(a, submission_state="uncertain", provider_call_started_at=w.clock.now,
          started_at=w.clock.now)  # its create's answer was lost; nothing created for A
    # B's prediction, as its webhook carries it
    body = requests.get(f"{w.rt.settings.replicate_base_url}/v1/predictions/{b_task}", timeout=10,
                        headers={"Authorization": f"Bearer {w.rt.settings.replicate_api_key}"}).content
    headers = replicate_headers(simulator.secrets.replicate_webhook_secret, body, "msg_replay",
                                int(w.clock.now.timestamp()))
    assert handle_webhook(w.rt, "replicate", headers, body, {"job_id": str(a)}) == \
        (202, {"status": "evidence"})
    w.clock.advance(minutes=6)
    w.tick()
    job = w.job(a)
    assert job.provider_task_id != b_task, "job A adopted job B's paid task"
    assert (job.status, job.submission_state) == ("pending", "uncertain")
