"""A stand-in for the platform's request process: runs one sync-kind job's call.

``python -m tests.reliability.standin <job_id>`` — the runtime comes from ``RECONCILE_*`` (so
``RECONCILE_TEST_CRASH_AT=sync_before_call|sync_after_call`` SIGKILLs this process group at that
point, exactly as it does a worker).
"""

from __future__ import annotations

import sys
import uuid

from reconcile import sync, tasks
from reconcile.errors import ProviderError


def main(job_id: str) -> int:
    rt = tasks.get_runtime()  # installs the test crash hook from the environment
    try:
        job = sync.run_sync(rt, uuid.UUID(job_id))
    except ProviderError as exc:
        print(f"sync call failed: {exc.code}", flush=True)
        return 1
    print(f"sync job {job.id} {job.status}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
