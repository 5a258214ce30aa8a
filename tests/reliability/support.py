"""Helpers shared by the reliability tests: a runtime on the test database, loopback HTTP
servers (a canary that must never be hit, a redirector/oversize server), table snapshots."""

from __future__ import annotations

import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime
from reconcile.db.models import CreditTransaction, Job, UsageLog
from reconcile.storage import LocalStorage
from reconcile.testing.simulator import Simulator
from tests.conftest import TABLES

CLOSED_HOOKS = "http://127.0.0.1:9/hooks"  # discard port: deliveries fail fast, bodies are kept


@dataclass
class Queues:
    creates: deque[uuid.UUID] = field(default_factory=deque)
    polls: deque[tuple[uuid.UUID, int, int]] = field(default_factory=deque)

    def enqueue_create(self, job_id: uuid.UUID, countdown: float = 0.0) -> None:
        self.creates.append(job_id)

    def enqueue_poll(self, job_id: uuid.UUID, generation: int, seq: int, countdown: float) -> None:
        self.polls.append((job_id, generation, seq))

    def clear(self) -> None:
        self.creates.clear()
        self.polls.clear()


def runtime(db: sessionmaker[Session], sim: Simulator, tmp: Path, *, clock: Any = None,
            webhook_base_url: str = CLOSED_HOOKS, **settings: Any) -> tuple[Runtime, Queues]:
    queues = Queues()
    # these tests step the poll chain's messages: chain mode unless a test asks for batch
    settings.setdefault("poll_mode", "chain")
    rt = Runtime(settings=sim.settings(webhook_base_url=webhook_base_url, **settings),
                 sessions=db, storage=LocalStorage(tmp / "media"),
                 enqueue_create=queues.enqueue_create, enqueue_poll=queues.enqueue_poll)
    if clock is not None:
        rt.clock = clock
    return rt, queues


def truncate(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        s.execute(text("TRUNCATE " + ", ".join(TABLES)))


def money_snapshot(db: sessionmaker[Session]) -> tuple[Any, ...]:
    """Every job's state and money columns, every usage log and ledger transaction."""
    with db() as s:
        jobs = tuple(s.execute(select(
            Job.id, Job.status, Job.submission_state, Job.provider_task_id, Job.credits_actual,
            Job.error_code, Job.completed_at, Job.output_data).order_by(Job.id)).all())
        logs = tuple(s.execute(select(UsageLog.job_id, UsageLog.status, UsageLog.credits)
                               .order_by(UsageLog.id)).all())
        txns = tuple(s.execute(select(CreditTransaction.id, CreditTransaction.amount)
                               .order_by(CreditTransaction.id)).all())
    return jobs, logs, txns


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        self.server.hits.append((self.command, self.path, self.headers.get("Host")))
        route = self.server.routes.get(self.path.split("?")[0])
        if route is None:
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"SECRET"[:4])
            return
        status, headers, body = route
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = _answer


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hits: list[tuple[str, str, str | None]] = []
        self.routes: dict[str, tuple[int, dict[str, str], bytes]] = {}


class LoopbackServer:
    """A tiny HTTP server on 127.0.0.1 that records every request and answers ``routes``."""

    def __init__(self) -> None:
        self._server = _Server()
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def hits(self) -> list[tuple[str, str, str | None]]:
        return list(self._server.hits)

    def route(self, path: str, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self._server.routes[path] = (status, headers, body)
