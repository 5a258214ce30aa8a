"""The testing kit's loopback servers (the simulator, the chaos run's webhook receiver) take a
burst of connects the way a provider's front end does: a batch round opens a connection per
media fetch and dozens of status reads at once, and with socketserver's default backlog of 5
every connect past the sixth had its SYN (or its final ACK) dropped and waited at least TCP's
1-s retransmit (the bench then measured the simulator, not the library).

The kernel is the judge: nothing accepts on the server below, so the connects that complete are
those its accept queue holds (Linux holds backlog + 1). The burst is 256, or the host's
``net.core.somaxconn`` cap when that is lower (the kernel caps every backlog there)."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconcile.testing.processes import _HookServer
from reconcile.testing.sim_http import SimServer


def _burst() -> int:
    try:
        cap = int(Path("/proc/sys/net/core/somaxconn").read_text())
    except (OSError, ValueError):
        cap = 128
    return min(256, cap)


@pytest.mark.parametrize("make", [lambda: SimServer(("127.0.0.1", 0), None),
                                  lambda: _HookServer(None)], ids=["simulator", "webhook_receiver"])
def test_a_burst_of_connects_completes_while_nothing_accepts(make: Callable[[], Any]) -> None:
    server = make()  # bound and listening; nobody calls accept()
    burst = _burst()
    clients: list[socket.socket] = []
    try:
        port = server.server_address[1]
        for _ in range(burst):
            client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", port))
            clients.append(client)
        pending = set(clients)
        connected = 0
        deadline = time.monotonic() + 0.5  # under TCP's first SYN retransmit (1 s)
        while pending and time.monotonic() < deadline:
            _, ready, _ = select.select([], list(pending), [], max(0.0, deadline - time.monotonic()))
            for client in ready:
                pending.discard(client)
                if client.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                    connected += 1
        assert connected == burst, f"{connected} of {burst} connects completed; the rest wait " \
                                   "for a SYN retransmit"
    finally:
        for client in clients:
            client.close()
        server.server_close()
