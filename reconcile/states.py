"""Internal: Job statuses, submission states and the constants of the lifecycle (pure, no I/O)."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

__all__ = [
    "ATTEMPT_SPACING", "CREATE_CLAIM_LEASE", "IN_FLIGHT", "LEGACY_AGE", "MAX_ATTEMPTS",
    "MAX_CREATE_REENQUEUES", "MAX_RATE_LIMITED_CREATES", "NOT_STARTED_AGE", "POLL_LEASE_SLACK",
    "POLL_READ_ATTEMPTS", "POLL_READ_BACKOFF_MAX", "PUBLIC_STATE", "SETTLE_BACKOFF_BASE",
    "SETTLE_BACKOFF_MAX", "Status", "Submission", "TERMINAL", "UNKNOWN_OUTCOME", "settle_backoff",
]


class Status(StrEnum):
    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Submission(StrEnum):
    """``jobs.submission_state``; NULL means a row the library never submitted."""

    NOT_STARTED = "not_started"
    SUBMITTING = "submitting"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    UNCERTAIN = "uncertain"


IN_FLIGHT = (Status.PENDING.value, Status.PROCESSING.value)
TERMINAL = (Status.COMPLETED.value, Status.FAILED.value, Status.CANCELLED.value)
#: a create in progress or lost: the provider may have created it (only evidence or an operator
#: resolves it)
UNKNOWN_OUTCOME = (Submission.SUBMITTING.value, Submission.UNCERTAIN.value)

MAX_ATTEMPTS = 18  # ≈ 90 minutes of attempts after the stale threshold (README, Design notes: Attempts and exhaustion)
ATTEMPT_SPACING = timedelta(minutes=5)  # an attempt counts at most once per 5 minutes per job
MAX_RATE_LIMITED_CREATES = 5  # 429 / KIE 455 retries before the job is rejected
MAX_CREATE_REENQUEUES = 5  # sweep re-enqueues of a lost create before giving up
CREATE_CLAIM_LEASE = timedelta(minutes=2)  # > connect + read timeouts of a create
# lease = 2 × poll interval + slack, renewed at each turn: a dead chain is resumed by the first
# sweep tick after it (bench figure 6: lease + one sweep interval is the recovery time; 25 s + a
# 30 s interval keeps p99 under a minute for a 5-s kind); a live chain must take its next turn
# within it (bench figure 3's lease-margin table). A late-but-alive chain that loses its lease is
# harmless — the resumed chain bumps the generation and the old one is fenced
POLL_LEASE_SLACK = timedelta(seconds=15)
# the longest a poll step's status read can take (lifecycle.poll_step_deadline; the lease no
# longer covers it, issue 16): the read (HttpClient.read) makes up to 1 + 3 attempts, each
# bounded by connect + read timeout (the per-request total deadline), with up to 30 s of backoff
# (Retry-After capped) between
POLL_READ_ATTEMPTS = 4
POLL_READ_BACKOFF_MAX = timedelta(seconds=30)
LEGACY_AGE = timedelta(minutes=5)
NOT_STARTED_AGE = timedelta(minutes=2)
SETTLE_BACKOFF_BASE = timedelta(seconds=30)
SETTLE_BACKOFF_MAX = timedelta(hours=1)

# the snapshot's public names (README, Design notes: The customer contract)
PUBLIC_STATE = {
    Status.PENDING.value: "queued",
    Status.PROCESSING.value: "running",
    Status.COMPLETED.value: "completed",
    Status.FAILED.value: "failed",
    Status.CANCELLED.value: "canceled",
}


def settle_backoff(attempts: int) -> timedelta:
    """Delay before the next settlement try after ``attempts`` failures (30 s doubling, ≤ 1 h)."""
    delay: timedelta = SETTLE_BACKOFF_BASE * (2 ** min(attempts, 12))
    return min(delay, SETTLE_BACKOFF_MAX)
