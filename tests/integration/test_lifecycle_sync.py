"""Sync calls under issue 11 (holes 6, 7 and 12), on PostgreSQL with the simulator.

Hole 6: a platform row's call is guarded by its status. Hole 7: a sync call has a total
deadline below its kind's threshold, checked at start-up, and its claim lease covers it. Hole
12: a stray create message never turns a sync job ``uncertain``.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from reconcile import lifecycle, sync, sync_call
from reconcile.errors import Conflict
from reconcile.lifecycle.cancel import cancel_job
from reconcile.testing.simulator import Simulator
from tests.integration._sweep_helpers import World, assert_refunded


@pytest.fixture
def world(db: sessionmaker[Session], simulator: Simulator, tmp_path: Path) -> World:
    return World(db, simulator, tmp_path)


def test_sync_call_on_a_cancelled_platform_row_raises_and_calls_nobody(world: World) -> None:
    """Hole 6: the user cancels a platform row (refunded); the platform's request then enters
    sync_call: it raises before the block runs, writes nothing, and the provider sees 0 calls."""
    w = world
    job_id = w.platform_row(status="pending", job_type="writer")
    assert cancel_job(w.rt, w.user, job_id).status == "cancelled"
    assert w.log_status(job_id) == "refunded"
    client = w.rt.client(w.rt.kind("anthropic-sync"))  # type: ignore[arg-type]
    ran: list[bool] = []
    with pytest.raises(Conflict), sync_call(w.rt, job_id, provider_kind="anthropic-sync"):
        ran.append(True)
        client.call("claude-sonnet-4-5", {"prompt": "hi"})  # type: ignore[union-attr]
    assert ran == [] and w.sim.attempts(provider="anthropic") == 0
    job = w.job(job_id)
    assert (job.status, job.provider_call_started_at, job.provider_kind) == ("cancelled", None, None)
    assert w.refunds(job_id) == 1 and w.audit() == []


def test_a_stray_create_message_never_makes_a_sync_job_uncertain(world: World) -> None:
    """Hole 12: the platform's request took the sync claim and died. A stray create message
    after the lease leaves the row alone (not ``uncertain``, which the sweep would hold for
    ever); the sweep then fails and refunds it past the threshold."""
    w = world
    job_id = w.submit("anthropic-sync")
    sync.claim(w.rt, job_id, None)  # sync_call's claim; the request then dies in its block
    assert w.job(job_id).submission_state == "submitting"
    w.clock.advance(minutes=10)  # past the claim lease and the 5-minute threshold
    assert lifecycle.create_step(w.rt, job_id).action == "lost"
    assert w.job(job_id).submission_state == "submitting"
    w.tick()
    assert_refunded(w, job_id)
    assert w.sim.attempts(provider="anthropic") == 0


def test_a_sync_job_left_uncertain_by_an_old_stray_create_is_failed_past_its_threshold(world: World) -> None:
    """A sync row already ``uncertain`` (written by the old stray-create path) is no longer
    held for ever: past the threshold the sweep fails and refunds it."""
    w = world
    job_id = w.submit("kie-llm")
    w.set(job_id, submission_state="submitting", provider_call_started_at=w.clock.now)
    w.set(job_id, submission_state="uncertain")
    w.clock.advance(minutes=2)
    w.tick()
    assert w.job(job_id).status == "pending"  # before the threshold: left
    w.clock.advance(minutes=4)
    w.tick()
    assert_refunded(w, job_id)


# --- hole 7: the sync call's total deadline and its claim lease --------------------------------

MESSAGE = (b'{"id": "msg_1", "type": "message", "model": "claude-x", "stop_reason": "end_turn", '
           b'"content": [{"type": "text", "text": "hello"}]}')


class Trickler:
    """A loopback server answering every POST a byte at a time (one every ``gap`` seconds,
    far below any read timeout), the status line and headers too when ``headers`` is set; the
    answer is a valid message after ``padding`` bytes of leading whitespace."""

    def __init__(self, *, headers: bool, padding: int = 200, gap: float = 0.05) -> None:
        import http.server
        import threading

        trickler = self
        self.finished = threading.Event()  # the whole answer was written (the client waited)
        self.cut = threading.Event()  # the client hung up before the end

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = b" " * padding + MESSAGE
                head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
                slow = (head + body) if headers else body
                try:
                    if not headers:
                        self.wfile.write(head)
                        self.wfile.flush()
                    for i in range(len(slow)):
                        self.wfile.write(slow[i:i + 1])
                        self.wfile.flush()
                        threading.Event().wait(gap)
                    trickler.finished.set()
                except OSError:
                    trickler.cut.set()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("trickled", ["body", "status_line_and_headers"])
def test_the_sync_deadline_ends_a_trickling_call_and_refunds(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path, trickled: str) -> None:
    """Hole 7: the provider trickles its answer a byte every 50 ms (each read is quick, so
    per-read timeouts never fire; the whole answer takes ~10 s). At TIME_SCALE 0.01 the
    deadline is 2.4 s: the call is cut there, fails UPSTREAM_TIMEOUT and is refunded at once,
    instead of completing whenever the provider is done."""
    server = Trickler(headers=trickled != "body")
    try:
        w = World(db, simulator, tmp_path, anthropic_base_url=server.url, time_scale=0.01)
        job_id = w.submit("anthropic-sync")
        done = sync.run_sync(w.rt, job_id)
        assert (done.status, done.error_code) == ("failed", "UPSTREAM_TIMEOUT"), done.error_message
        assert "deadline" in (done.error_message or "")
        assert done.credits_actual == 0 and w.log_status(job_id) == "refunded"
        assert server.cut.wait(30) and not server.finished.is_set()
    finally:
        server.close()


def test_a_sync_call_still_running_at_302_s_is_not_failed_by_the_sweep(world: World) -> None:
    """Hole 7: the claim lease covers the deadline and the finish: a sweep at 302 s leaves the
    running call alone, and its result is kept (completed and charged)."""
    w = world
    job_id = w.submit("anthropic-sync")
    client = w.rt.client(w.rt.kind("anthropic-sync"))  # type: ignore[arg-type]
    with sync_call(w.rt, job_id) as call:
        w.clock.advance(seconds=302)
        w.tick()
        assert (w.job(job_id).status, w.job(job_id).submission_state) == ("pending", "submitting")
        call.result = client.call("claude-sonnet-4-5", {"prompt": "hi"})  # type: ignore[union-attr]
    job = w.job(job_id)
    assert (job.status, job.credits_actual) == ("completed", 40)
    assert w.log_status(job_id) == "committed" and w.audit() == []


def test_a_platform_rows_sync_call_gets_the_same_time_as_a_library_rows(world: World) -> None:
    """Issue 24 (suspected, confirmed): a platform row's ``sync_call`` had only its kind's
    threshold (300 s: 60 s past ``SYNC_DEADLINE``) before the sweep failed and refunded it,
    against the claim lease (deadline + 2 min finish: 360 s) of a library row; the call's paid
    answer was then thrown away. Both now hold the one claim lease (``sync.claim_lease``): a
    sweep at 302 s leaves the call alone and its result is kept; a call that dies is failed and
    refunded once that same lease has passed, and the platform's own plumbed call (no claim:
    ``test_anthropic_sync_processing_past_five_minutes_fails_after_one_tick``) at its threshold.
    Fails on old code (the 302 s sweep refunds the running call)."""
    w = world
    client = w.rt.client(w.rt.kind("anthropic-sync"))  # type: ignore[arg-type]
    for kind in (None, "anthropic-sync"):  # a library row, then a platform row
        job_id = w.submit("anthropic-sync") if kind is None else w.platform_row(status="pending")
        with sync_call(w.rt, job_id, provider_kind=kind) as call:
            w.clock.advance(seconds=302)
            w.tick()
            assert w.job(job_id).status == "pending", kind
            call.result = client.call("claude-sonnet-4-5", {"prompt": "hi"})  # type: ignore[union-attr]
        job = w.job(job_id)
        assert (job.status, job.credits_actual) == ("completed", 40), kind
        assert w.log_status(job_id) == "committed"
    dead = w.platform_row(status="pending")
    sync.claim(w.rt, dead, "anthropic-sync")  # the platform's request then dies in its block
    lease = sync.claim_lease(w.rt.settings, w.rt.kind("anthropic-sync"))  # type: ignore[arg-type]
    w.clock.advance(seconds=lease.total_seconds() - 1)
    w.tick()
    assert w.job(dead).status == "pending"
    w.clock.advance(seconds=2)
    w.tick()
    assert_refunded(w, dead)
    assert w.audit() == []


def test_settings_that_break_the_sync_deadline_are_refused_at_start_up(pg_url: str) -> None:
    """Hole 7: the deadline must fit every sync kind (threshold − 60 s: 240 s for the 5-minute
    kinds) and exceed the connect timeout; otherwise start-up fails with a clear error."""
    from reconcile import Kind, Runtime, Settings

    Runtime.from_settings(Settings(database_url=pg_url))  # the defaults fit: 240 s
    with pytest.raises(ValueError, match=r"SYNC_DEADLINE=241s .*threshold 300s minus 60 s = 240s"):
        Runtime.from_settings(Settings(database_url=pg_url, sync_deadline=241))
    with pytest.raises(ValueError, match="CONNECT_TIMEOUT"):
        Runtime.from_settings(Settings(database_url=pg_url, sync_deadline=10, connect_timeout=10))
    quick = Kind("acme-quick-sync", True, timedelta(minutes=3), None, None, None, "x:y")
    with pytest.raises(ValueError, match="acme-quick-sync"):
        sync.check_sync_deadline(Settings(database_url=pg_url), [quick])
    sync.check_sync_deadline(Settings(database_url=pg_url, sync_deadline=120), [quick])


def test_a_misconfigured_deadline_makes_no_sync_call(world: World) -> None:
    """A runtime built without the start-up check still refuses in sync_call: no claim, no call."""
    w = world
    job_id = w.submit("anthropic-sync")
    w.rt.settings = w.rt.settings.model_copy(update={"sync_deadline": 300.0})
    with pytest.raises(ValueError), sync_call(w.rt, job_id):
        pytest.fail("the block must not run")
    assert w.job(job_id).submission_state == "not_started"


# --- issue 24 finding 8: one call per platform row --------------------------------------------


def test_two_concurrent_sync_calls_on_a_platform_row_call_the_provider_once(world: World) -> None:
    """The platform's request and a client's retry enter ``sync_call`` on the same platform row
    at once (two threads, two PostgreSQL sessions). One takes the call; the other — arriving
    while the first is inside its provider call — gets 409 SUBMISSION_RECONCILIATION_REQUIRED,
    as a library sync job's second call does, and calls nobody: one paid call, one charge."""
    from reconcile import api

    w = world
    job_id = w.platform_row(status="pending", job_type="writer")
    client = w.rt.client(w.rt.kind("anthropic-sync"))  # type: ignore[arg-type]
    start, resolved = threading.Barrier(2), threading.Event()
    inside: list[str] = []
    refused: list[Conflict] = []

    def request(name: str) -> None:
        start.wait(timeout=10)
        try:
            with sync_call(w.rt, job_id, provider_kind="anthropic-sync") as call:
                inside.append(name)
                resolved.wait(timeout=5)  # the provider call is under way when the retry lands
                call.result = client.call("claude-sonnet-4-5", {"prompt": "hi"})  # type: ignore[union-attr]
        except Conflict as exc:
            refused.append(exc)
            resolved.set()

    threads = [threading.Thread(target=request, args=(n,)) for n in ("request", "retry")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(inside) == 1 and len(refused) == 1, (inside, refused)
    assert api.error_response(refused[0], job_id=job_id)[0] == 409
    assert refused[0].code == "SUBMISSION_RECONCILIATION_REQUIRED"
    assert w.sim.attempts(provider="anthropic") == 1
    job = w.job(job_id)
    assert (job.status, job.provider_kind) == ("completed", "anthropic-sync")
    assert w.refunds(job_id) == 0 and w.audit() == []

    # the library's own sync job answers the same to a second call
    library_job = w.submit("anthropic-sync")
    with sync_call(w.rt, library_job) as call:
        with pytest.raises(Conflict) as second, sync_call(w.rt, library_job):
            pytest.fail("a second call must not run")
        call.result = client.call("claude-sonnet-4-5", {"prompt": "hi"})  # type: ignore[union-attr]
    assert second.value.code == refused[0].code
    assert w.sim.attempts(provider="anthropic") == 2
