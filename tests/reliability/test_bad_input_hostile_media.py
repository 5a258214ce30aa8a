"""Hostile and oversize media URLs (real PostgreSQL + the simulator + a loopback server): a
provider that succeeds with a private, redirected, non-HTTP or oversize URL never gets it
fetched or the job completed; the job is failed and refunded once at exhaustion, as is a sync
call's hostile output.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reconcile import Kind, credits, lifecycle, register_kind, sync_call
from reconcile.db.models import Asset, UsageLog
from reconcile.kinds import unregister_kind
from reconcile.providers import Created, CreateRequest, ListedTask, Output, PollResult, PollStatus
from reconcile.sweep import sweep
from reconcile.testing.simulator import Simulator
from tests.integration.harness import Clock, drain
from tests.reliability._bad_input_helpers import load_job, submit
from tests.reliability.support import LoopbackServer, runtime

# --------------------------------------------------------------------------- hostile media


class HostileClient:
    """An AsyncProvider whose task 'succeeds' with whatever URLs the test gives it."""

    name = "reliability-hostile"

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.polls = 0

    def create(self, request: CreateRequest) -> Created:
        return Created(f"hostile-{request.job_id}")

    def poll(self, task_id: str, *, model: str | None = None) -> PollResult:
        self.polls += 1
        return PollResult(status=PollStatus.SUCCEEDED, raw_status="succeeded",
                          outputs=tuple(Output(url=u) for u in self.urls))

    def cancel(self, task_id: str, *, model: str | None = None) -> bool:
        return False

    def find_created(self, job_id: str, created_after: datetime) -> ListedTask | None:
        return None


@pytest.fixture
def media_server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as server:
        yield server


def _hostile_urls(port: int) -> dict[str, list[str]]:
    allowed = f"http://127.0.0.1:{port}"  # allow-listed (the simulator's host)
    return {
        "metadata": ["http://169.254.169.254/latest/meta-data"],
        "metadata-v6": ["http://[fd00:ec2::254]/latest/meta-data"],
        "file": ["file:///etc/passwd"],
        "gopher": [f"gopher://localhost:{port}/_secret"],
        "localhost": [f"http://localhost:{port}/secret-localhost"],
        "hex-loopback": [f"http://0x7f000001:{port}/secret-hex"],
        "mapped-v6": [f"http://[::ffff:127.0.0.1]:{port}/secret-v6"],
        "unspecified": [f"http://0.0.0.0:{port}/secret-zero"],
        "redirect-to-loopback": [f"{allowed}/redirect-loopback"],
        "redirect-to-metadata": [f"{allowed}/redirect-metadata"],
        "redirect-to-file": [f"{allowed}/redirect-file"],
        "oversize-declared": [f"{allowed}/big-declared"],
        "oversize-streamed": [f"{allowed}/big-streamed"],
        "one-good-one-bad": [f"{allowed}/good.png", "file:///etc/passwd"],
    }


HOSTILE = sorted(_hostile_urls(0))


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_or_oversize_media_is_never_fetched_or_completed(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        media_server: LoopbackServer, case: str) -> None:
    """A provider that 'succeeds' with a hostile or oversize URL: nothing private is fetched,
    nothing is stored, the job never completes; it stays in flight and, at exhaustion, fails and
    is refunded exactly once (outcome table: media errors are retried until exhaustion)."""
    port = media_server.port
    media_server.route("/redirect-loopback", 302, {"Location": f"http://localhost:{port}/secret-r"})
    media_server.route("/redirect-metadata", 302,
                       {"Location": "http://169.254.169.254/latest/meta-data/iam"})
    media_server.route("/redirect-file", 302, {"Location": "file:///etc/passwd"})
    media_server.route("/big-declared", 200, {"Content-Type": "image/png",
                                              "Content-Length": str(5_000_000)}, b"x" * 10)
    media_server.route("/big-streamed", 200, {"Content-Type": "image/png"}, b"x" * 300_000)
    media_server.route("/good.png", 200, {"Content-Type": "image/png",
                                          "Content-Length": "3"}, b"png")
    client = HostileClient(_hostile_urls(port)[case])
    name = f"reliability-hostile-{uuid.uuid4().hex[:6]}"
    register_kind(Kind(name, False, timedelta(minutes=10), timedelta(seconds=5), timedelta(hours=1),
                       "test", client="", factory=lambda settings, session: client))
    try:
        clock = Clock(datetime.now(UTC))
        rt, q = runtime(db, simulator, tmp_path, clock=clock, media_max_bytes=100_000,
                        media_timeout=5.0, media_allowed_hosts=["127.0.0.1:*"])
        job_id = submit(rt, db, name)
        lifecycle.create_step(rt, job_id)
        drain(rt, q, max_steps=6)  # type: ignore[arg-type]
        assert client.polls >= 2
        job = load_job(db, job_id)
        assert job.status == "processing", (job.status, job.error_code)
        # exhaustion: attempts past the threshold, one per 5 minutes, through the sweep
        for _ in range(MAX_TICKS):
            clock.advance(minutes=6)
            sweep(rt)
            q.clear()
            if load_job(db, job_id).status != "processing":
                break
        job = load_job(db, job_id)
        assert job.status == "failed" and job.credits_actual == 0, (job.status, job.error_code)
        # a refused URL is a media failure, retried to exhaustion (not expired media): the code
        # is the exhaustion's, the refusal itself is kept as the last error
        assert job.error_code in ("UPSTREAM_TIMEOUT", "UPSTREAM_FAILED"), job.error_code
        assert "media" in (job.reconcile_last_error or ""), job.reconcile_last_error
        with db() as s:
            assert s.execute(select(UsageLog.status).where(UsageLog.job_id == job_id)
                             ).scalar_one() == "refunded"
            assert s.execute(select(func.count()).select_from(Asset)).scalar_one() == 0
            assert credits.audit(s, now=clock.now) == []
        # a fetch that fails part-way leaves the outputs already stored as orphans (no asset row
        # names them; the chaos report counts such objects): only the good output may be there
        good = [f"image/{job_id}/0.png"] if case == "one-good-one-bad" else []
        assert set(rt.storage.keys()) <= set(good)
        assert [h for h in media_server.hits if "secret" in h[1]] == []
    finally:
        unregister_kind(name)


MAX_TICKS = 40


def test_sync_call_with_a_hostile_output_url_never_completes(
        db: sessionmaker[Session], simulator: Simulator, tmp_path: Path,
        media_server: LoopbackServer) -> None:
    """A sync answer whose output is a metadata URL: the finalize refuses it, the job is left
    for the sweep, which fails and refunds it past the kind's threshold; nothing is fetched."""
    from reconcile.errors import MediaError
    from reconcile.providers import SyncResult

    clock = Clock(datetime.now(UTC))
    rt, _ = runtime(db, simulator, tmp_path, clock=clock)
    job_id = submit(rt, db, "anthropic-sync")
    with pytest.raises(MediaError), sync_call(rt, job_id) as call:
        call.result = SyncResult((Output(url=f"http://localhost:{media_server.port}/secret"),))
    assert load_job(db, job_id).status == "pending"
    clock.advance(minutes=6)
    sweep(rt)
    job = load_job(db, job_id)
    assert (job.status, job.error_code, job.credits_actual) == ("failed", "RECONCILE_NO_RECOVERY", 0)
    assert media_server.hits == [] and rt.storage.keys() == []
