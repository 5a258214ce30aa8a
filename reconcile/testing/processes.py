"""Internal: the library's own mechanics, not an import path for platforms (may move).

Real processes for the reliability harness: a scratch ``redis-server``, ``celery worker``
subprocesses killed by process group, the platform's webhook endpoint, a bare Celery sender.

Shipped beside the simulator so a platform's own crash tests can use them; the chaos run
(:mod:`reconcile.testing.chaos`) and the crash-matrix tests are built on them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from ..celery_install import QUEUE, QUEUES, routes
from ..settings import Settings
from .sim_http import LoopbackHTTPServer

__all__ = ["CeleryWorker", "ScratchRedis", "WebhookReceiver", "celery_sender",
           "close_rabbitmq_connections", "enqueuers", "free_port"]

log = logging.getLogger("reconcile.testing")

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ScratchRedis:
    """``redis-server`` on a free loopback port, no persistence: a restart loses every message."""

    def __init__(self, port: int = 0, *, databases: int = 16, log_path: Path | None = None) -> None:
        self.port = port or free_port()
        self.databases = databases
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 15.0) -> ScratchRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--databases", str(self.databases),
             "--maxmemory-policy", "noeviction"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ping():
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            time.sleep(0.05)
        raise TimeoutError(f"redis-server on port {self.port} did not answer")

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5,
                                    socket_connect_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def flush(self, db: int) -> None:
        import redis

        redis.Redis.from_url(self.url(db)).flushdb()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self, down_for: float = 0.5) -> None:
        """SIGKILL it, stay down ``down_for`` seconds, start again on the same port (empty)."""
        self.kill()
        time.sleep(down_for)
        self.start()
        self.restarts += 1

    def stop(self) -> None:
        self.kill()


def close_rabbitmq_connections(vhost: str, reason: str = "reconcile broker-fault test") -> int:
    """Close every client connection of ONE RabbitMQ vhost (``rabbitmqctl``; never another
    vhost's: ``close_all_connections`` would hit everyone on the server). Returns how many."""
    if not vhost or vhost == "/":
        raise ValueError("refusing to close the default vhost's connections")
    listed = subprocess.run(
        ["rabbitmqctl", "list_connections", "-q", "--no-table-headers", "vhost", "pid"],
        capture_output=True, text=True, timeout=120, check=True).stdout
    closed = 0
    for line in listed.splitlines():
        parts = line.strip().split("\t")
        if len(parts) == 2 and parts[0] == vhost:
            done = subprocess.run(["rabbitmqctl", "close_connection", parts[1], reason],
                                  capture_output=True, text=True, timeout=120)
            closed += done.returncode == 0
    return closed


class CeleryWorker:
    """``celery -A reconcile.celery_app worker`` in its own process group (killed as a whole)."""

    def __init__(self, env: Mapping[str, str], log_path: Path, *, concurrency: int = 1,
                 queues: str = ",".join(QUEUES), name: str | None = None) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._start = log_path.stat().st_size
        self.log_start = self._start  # where this process's lines begin in a shared log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "reconcile.celery_app", "worker",
             "--pool=prefork", f"--concurrency={concurrency}", "-Q", queues,
             "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "info",
             "-n", f"{name or 'chaos'}-{time.time_ns()}@%h"],
            cwd=ROOT, env={**os.environ, **env}, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True)

    def ready(self) -> bool:
        with open(self.log_path, "rb") as fh:
            fh.seek(self._start)
            return b"ready." in fh.read()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.tail()}")
            time.sleep(0.1)
        raise TimeoutError(f"worker not ready: {self.tail()}")

    def tail(self, size: int = 3000) -> str:
        return self.log_path.read_bytes()[-size:].decode(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill_group(self) -> None:
        """SIGKILL the main process and every pool child at once."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a zombie we cannot reap
            pass

    def stop(self) -> None:
        if self.alive():
            self.kill_group()
        self._log.close()


class _HookHandler(BaseHTTPRequestHandler):
    server: _HookServer

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        from ..webhook_ingest import handle_webhook

        split = urlsplit(self.path)
        provider = split.path.rstrip("/").rsplit("/", 1)[-1]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            status, answer = handle_webhook(self.server.rt, provider, dict(self.headers.items()),
                                            body, dict(parse_qsl(split.query)))
        except Exception as exc:  # e.g. a terminated backend: a 5xx, the provider retries
            log.info("webhook_receiver_failed path=%s error=%s", self.path, exc)
            status, answer = 500, {"error": "internal"}
        self.server.answers[status] += 1
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _HookServer(LoopbackHTTPServer):

    def __init__(self, rt: Any) -> None:
        super().__init__(("127.0.0.1", 0), _HookHandler)
        self.rt = rt
        self.answers: Counter[int] = Counter()


class WebhookReceiver:
    """The platform's webhook endpoint: POST ``{base}/webhooks/{provider}`` → ``handle_webhook``."""

    def __init__(self, rt: Any) -> None:
        self._server = _HookServer(rt)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="webhook-receiver")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hooks"

    @property
    def answers(self) -> Counter[int]:
        return self._server.answers

    def set_runtime(self, rt: Any) -> None:
        self._server.rt = rt

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def celery_sender(broker: str) -> Any:
    """A bare Celery app that publishes to the library's queues (as a platform's web tier)."""
    from celery import Celery

    app = Celery("chaos-sender", broker=broker)
    app.conf.task_default_queue = QUEUE
    app.conf.task_routes = routes(Settings().queue_layout)
    app.conf.broker_connection_retry_on_startup = True
    return app


_RETRY = {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2, "interval_max": 0.5}


def enqueuers(app: Any) -> tuple[Callable[..., None], Callable[..., None]]:
    """``(enqueue_create, enqueue_poll)`` publishing through ``app`` (ids only)."""

    def create(job_id: uuid.UUID, countdown: float = 0.0) -> None:
        app.send_task("reconcile.create", args=[str(job_id)], countdown=countdown or None,
                      retry=True, retry_policy=_RETRY)

    def poll(job_id: uuid.UUID, generation: int, seq: int, countdown: float) -> None:
        app.send_task("reconcile.poll", args=[str(job_id), generation, seq],
                      countdown=countdown or None, retry=True, retry_policy=_RETRY)

    return create, poll
