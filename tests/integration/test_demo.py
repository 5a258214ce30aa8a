"""``python -m reconcile.demo`` end to end, exactly as a new user runs it: no database or broker
server (SQLite file, ``filesystem://`` broker, local storage), real prefork workers, a worker
SIGKILLed mid-poll (chain mode) or right after claiming a batch (batch mode), a create dropped
after acceptance, a sync request killed mid-call. Run once per poll mode.

Marked ``slow`` (it spawns real worker processes); nothing deselects ``slow``, so it is part
of the default ``make test`` run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TIMEOUT = 150  # seconds; the demo itself takes ~25 s and promises < 90 s


def _run_demo(cwd: Path, mode: str) -> tuple[int, str]:
    # the embedded default whatever the developer's shell says (no RECONCILE_DATABASE_URL …)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_")}
    env["RECONCILE_POLL_MODE"] = mode
    proc = subprocess.Popen([sys.executable, "-m", "reconcile.demo"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the demo kills its process groups on the way out
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        pytest.fail(f"the demo took more than {TIMEOUT}s:\n{out[-8000:]}")
    return proc.returncode, out


@pytest.mark.parametrize("mode", ["chain", "batch"])
def test_demo_exits_zero_with_every_invariant_holding(tmp_path: Path, mode: str) -> None:
    """The demo exits 0, prints the per-job table, the sweep ticks and a clean ledger audit, and
    tells the story of the poll mode it was given."""
    code, out = _run_demo(tmp_path, mode)
    assert code == 0, out[-8000:]
    assert re.search(rf"\] poll mode {mode}: ", out), out[:3000]
    assert "DEMO OK: every invariant holds" in out
    assert re.search(r"^ledger audit: clean\b", out, re.M), out[-4000:]

    # the per-job table: a header and one row per job of the batch (20)
    assert re.search(r"^job\s+kind\s+story\s+outcome\s+error code\s+creates\s+reserved\s+"
                     r"committed\s+refunded\s+settled by$", out, re.M), out[-6000:]
    rows = re.findall(r"^[0-9a-f]{8}  \S+", out, re.M)
    assert len(rows) == 20, out[-6000:]

    # each part of the story happened
    if mode == "chain":
        assert re.search(r"worker A died mid-poll: whole process group SIGKILLed \(exit -9\)", out)
        assert re.search(r"\bsweep-resumed$", out, re.M)
    else:
        assert re.search(r"worker A died right after claiming a batch: whole process group "
                         r"SIGKILLed \(exit -9\); it holds [1-9]\d* row\(s\) claimed", out), \
            out[-6000:]
        # a row A held claimed came back (released by a reaper, or due again after its lease)
        assert re.search(r"\b(released|due-again)$", out, re.M), out[-6000:]
        assert not re.search(r"\bsweep-resumed$", out, re.M)
        assert re.search(r"^poll_due ticks sent by this process: [1-9]\d*", out, re.M)
    assert re.search(r"pending/uncertain\s+UPSTREAM_SUBMISSION_UNCERTAIN\s+1\s.*left-uncertain$",
                     out, re.M)
    assert re.search(r"failed\s+UPSTREAM_FAILED\s.*\s25\s+0\s+25\s+\S+$", out, re.M)
    assert re.search(r"failed\s+RECONCILE_NO_RECOVERY\s.*refunded-by-sweep$", out, re.M)
    assert re.search(r"^\s+[\d.]+s  \[reconcile\] scanned=\d+ recovered=\d+ failed=\d+ "
                     r"stillRunning=\d+ errors=0 \(\d+ms\)", out, re.M)
    # the work folder is the demo's own, under the cwd
    assert (tmp_path / "demo-run" / "reconcile.db").is_file()
