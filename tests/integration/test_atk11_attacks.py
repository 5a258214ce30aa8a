"""Attacker atk11 (issue 11 follow-up): reproducers against the hole fixes, on PostgreSQL with
the shipped simulator and loopback servers. Every test here was written as a REPRODUCER: it
failed on main at acd9c7e; the fix commit that follows it on branch atk11 makes it pass."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from reconcile import sync
from reconcile.testing.simulator import Simulator
from tests.integration.test_lifecycle_sync import Trickler
from tests.integration.test_sweep import World


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
