"""Internal: the library's own mechanics, not an import path for platforms (may move).

The stdlib HTTP plumbing under the simulator: a threading server that can close its idle
keep-alive connections, a handler that hands every request to ``Simulator.dispatch``, and the
simulator's serving lifecycle (:class:`Serving`: start, TLS, stop)."""

from __future__ import annotations

import socket
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from .sim_core import json_response

if TYPE_CHECKING:
    # reconcile.testing.simulator.Simulator, which imports this module: named, not imported
    # back (the simulator's modules are not type-checked: pyproject.toml)
    Simulator = Any


# the listen backlog of the loopback servers the testing kit runs (the simulator, the chaos
# run's webhook receiver). socketserver's default is 5: a burst of concurrent connects (a batch
# round's status reads and media fetches, each fetch on a connection of its own; a burst of
# webhook deliveries) overflowed it, and every dropped SYN (or final ACK) waited at least TCP's
# 1-s retransmit, so the server, not the client, set the burst's pace. A provider's front end
# accepts far more; the kernel caps this at net.core.somaxconn
BACKLOG = 1024


class LoopbackHTTPServer(ThreadingHTTPServer):
    """The testing kit's HTTP server: a thread per connection (daemon: never holds the
    process's exit) and a listen backlog of :data:`BACKLOG`."""

    daemon_threads = True
    request_queue_size = BACKLOG


class SimServer(LoopbackHTTPServer):
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], sim: Simulator) -> None:
        self.sim = sim
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, SimHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Close idle keep-alive connections so no handler outlives ``Simulator.stop``."""
        with self._open_lock:
            sockets = list(self._open)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class SimHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "reconcile-sim/0.1"
    sys_version = ""
    timeout = 60
    server: SimServer

    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate writes: without this, Nagle + delayed ACK add
        # ~40 ms to every keep-alive request
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            response = self.server.sim.dispatch(self.command, self.path, headers, body)
        except Exception:
            response = json_response(500, {"error": "simulator bug",
                                           "traceback": traceback.format_exc()})
        if response.latency > 0:
            time.sleep(response.latency)
        if response.drop:  # accepted, then the connection dies without an answer
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read counters
        pass


class Serving:
    """The :class:`~reconcile.testing.simulator.Simulator`'s server threads (a mixin)."""

    host: str
    port: int
    _server: SimServer | None
    _tls_servers: list[SimServer]
    _threads: list[threading.Thread]
    _stopping: threading.Event
    _url: str | None

    _tick_forever: Any  # the webhook ticker (:class:`.sim_delivery.Delivering`)

    def start(self) -> Any:
        if self._server is not None:
            return self
        self._stopping.clear()
        self._server = SimServer((self.host, self.port), self)
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        self._url = f"http://{host}:{self._server.server_address[1]}"
        self._threads = [
            threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                             name="sim-http", daemon=True),
            threading.Thread(target=self._tick_forever, name="sim-webhooks", daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def serve_tls(self, certfile: str, keyfile: str) -> str:
        """Also serve over TLS on another loopback port; returns its ``https://`` URL.

        For SDKs whose scheme is fixed to https (fal_client builds ``https://{FAL_QUEUE_RUN_HOST}/``
        from its env var): point the env var at this URL's host and trust ``certfile`` through
        ``SSL_CERT_FILE``. Answers are the same simulator's (returned URLs stay on :attr:`url`).
        """
        import ssl

        if self._server is None:
            raise RuntimeError("start the simulator first")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(certfile, keyfile)
        server = SimServer((self.host, 0), self)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._tls_servers.append(server)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                  name="sim-https", daemon=True)
        self._threads.append(thread)
        thread.start()
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"https://{host}:{server.server_address[1]}"

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        for extra in self._tls_servers:
            extra.shutdown()
            extra.close_connections()
            extra.server_close()
        self._tls_servers = []
        server.shutdown()
        server.close_connections()
        server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the simulator is not started")
        return self._url
