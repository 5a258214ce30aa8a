"""Internal: the library's own mechanics, not an import path for platforms (may move).

``python -m reconcile.testing.simulator``: serve the simulator until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any


def main(argv: list[str] | None, simulator: Callable[..., Any]) -> int:
    """Serve ``simulator`` (the :class:`~reconcile.testing.simulator.Simulator` class, which
    hands itself in: it imports this module) until SIGTERM/SIGINT; prints the URL, then the
    settings env."""
    parser = argparse.ArgumentParser(prog="python -m reconcile.testing.simulator",
                                     description="Loopback simulator of the AI providers' APIs.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--seed", type=int, default=None, help="seed for ids and chaos")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="real seconds per timeline second (0.01: 30 min play in 18 s)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    from .sim_registry import missing

    for family, why in missing().items():
        print(f"warning: nothing simulates provider family {family!r} ({why}); its URL "
              f"settings point at a path that answers 404", file=sys.stderr, flush=True)
    with simulator(args.host, args.port, seed=args.seed, time_scale=args.time_scale) as sim:
        print(sim.url, flush=True)
        for name, value in sim.env().items():
            print(f"{name}={value}", flush=True)
        while not stop.wait(0.2):
            pass
    return 0
