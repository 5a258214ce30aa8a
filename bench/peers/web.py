"""The web tier of the peers benchmark, a process of its own: submit N jobs one after another
through a system's submit path and report the CPU it took.

    python -m bench.peers.web <module> <n> <users.json> <out.json>

``<module>`` is ``plain_celery``, ``dbos_app`` or ``reconcile_app``: its ``web_submitter()``
sets the tier up (engine, client, runtime; connected) and returns the submit of one job for a
user. The environment is the system's. CPU = this process's CPU time (every thread) over the
submit loop; imports and setup excluded, as a long-running web server has them behind it.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import uuid
from pathlib import Path


def main(argv: list[str]) -> int:
    module, n, users_path, out = argv[0], int(argv[1]), Path(argv[2]), Path(argv[3])
    users = [uuid.UUID(u) for u in json.loads(users_path.read_text())]
    submit = importlib.import_module(f"bench.peers.{module}").web_submitter()
    go = out.with_name(out.name + ".go")
    print("web tier ready", flush=True)  # the driver starts its counters, then creates `go`
    while not go.exists():
        time.sleep(0.01)
    started_at = time.time()
    wall0, cpu0 = time.monotonic(), time.process_time()
    for i in range(n):
        submit(users[i % len(users)])
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    out.write_text(json.dumps({"submits": n, "started_at": started_at, "wall_s": wall,
                               "cpu_s": cpu}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
