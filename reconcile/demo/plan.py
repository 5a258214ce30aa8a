"""The demo's batch: what each job submits, how the simulator treats it, what must happen; the
credits granted; and :class:`Story`, the record of what happened during the run."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

DEFAULT_TIME_SCALE = 0.05
SWEEP_EVERY = 1.0  # real seconds between sweep ticks (SWEEP_INTERVAL = this / TIME_SCALE)
DEADLINE = 80.0  # real seconds from start by which every job must be settled
CRASH_POINT = "mid_poll"  # chain mode: worker A dies in the middle of one poll
BATCH_CRASH_POINT = "mid_batch"  # batch mode: right after a claim committed, before its reads
SYNC_CRASH_POINT = "sync_after_call"

# ----------------------------------------------------------------------------- the batch


@dataclass(frozen=True)
class Planned:
    """One job of the story: what to submit, how the simulator treats it, what must happen."""

    name: str
    kind: str
    model: str
    input: Mapping[str, Any]
    credits: int
    expect: str  # completed | failed:<code> | uncertain
    timeline: tuple[tuple[float, str], ...] = ()  # real seconds after create (async kinds)
    outputs: int = 1
    create: str = "accept"
    webhook: bool = False
    crash: bool = False  # sync: the request process dies after the provider answered
    user: int = 0  # which demo user pays


def _done_at(seconds: float) -> tuple[tuple[float, str], ...]:
    return ((0.0, "queued"), (min(0.4, seconds / 2), "running"), (seconds, "succeeded"))


QUICK, LONG = 2.0, 9.0  # real seconds until the provider finishes
_PROMPT = {"prompt": "a lighthouse at dusk"}
_DUB = {"source_url": "https://media.example/talk.mp4", "target_lang": "es"}


def batch() -> list[Planned]:
    """The mixed batch: quick jobs finish before the crash, long ones are in flight when worker
    A dies and must be resumed through the sweep."""
    ok = "completed"
    return [
        Planned("market quick x2", "kie-standard", "seedream/4.5-edit", _PROMPT, 40, ok,
                _done_at(QUICK), outputs=2),
        Planned("market quick", "kie-standard", "nano-banana", _PROMPT, 20, ok, _done_at(QUICK)),
        Planned("market long", "kie-standard", "flux-2-pro", _PROMPT, 30, ok, _done_at(LONG)),
        Planned("market fails", "kie-standard", "seedream/4.5", _PROMPT, 25, "failed:UPSTREAM_FAILED",
                ((0.0, "queued"), (0.3, "running"), (1.5, "failed"))),
        Planned("market dropped", "kie-standard", "gpt-image-1", _PROMPT, 35, "uncertain",
                _done_at(QUICK), create="drop_after_accept", user=1),
        Planned("veo quick+hook", "kie-veo", "veo3_fast", _PROMPT, 60, ok, _done_at(QUICK),
                webhook=True),
        Planned("veo long", "kie-veo", "veo3", _PROMPT, 80, ok, _done_at(LONG), user=1),
        Planned("replicate quick x2", "replicate-prediction", "owner/sdxl:abc123", _PROMPT, 15, ok,
                _done_at(QUICK), outputs=2),
        Planned("replicate hook", "replicate-prediction", "owner/flux:def456", _PROMPT, 15, ok,
                _done_at(QUICK), webhook=True),
        Planned("replicate long", "replicate-prediction", "owner/video:987fed", _PROMPT, 50, ok,
                _done_at(LONG), user=1),
        Planned("dubbing quick", "elevenlabs-async", "dubbing", _DUB, 45, ok, _done_at(QUICK)),
        Planned("dubbing long", "elevenlabs-async", "dubbing", _DUB, 45, ok, _done_at(LONG)),
        Planned("fal quick", "fal-queue", "fal-ai/flux/dev", _PROMPT, 10, ok, _done_at(QUICK)),
        Planned("fal hook", "fal-queue", "fal-ai/flux/schnell", _PROMPT, 10, ok, _done_at(QUICK),
                webhook=True),
        Planned("fal long", "fal-queue", "fal-ai/kling-video", _PROMPT, 70, ok, _done_at(LONG),
                user=1),
        Planned("claude", "anthropic-sync", "claude-sonnet-4-5", {"prompt": "haiku"}, 5, ok),
        Planned("claude #2", "anthropic-sync", "claude-haiku-4-5", {"prompt": "limerick"}, 5, ok,
                user=1),
        Planned("claude, request dies", "anthropic-sync", "claude-sonnet-4-5",
                {"prompt": "sonnet"}, 8, "failed:RECONCILE_NO_RECOVERY", crash=True),
        Planned("kie chat", "kie-llm", "gpt-5", {"prompt": "summarise"}, 4, ok),
        Planned("kie chat #2", "kie-llm", "gemini-2.5-pro", {"prompt": "translate"}, 4, ok,
                user=1),
    ]


GRANTS = ((("sub", 600), ("topup", 400)), (("sub", 300), ("topup", 200)))


@dataclass
class Story:
    plans: list[Planned]
    ids: list[uuid.UUID]
    users: list[uuid.UUID]
    crash_rc: int | None = None
    worker_b_rc: int | None = None  # None: worker B was still alive at the end
    in_flight_at_crash: list[uuid.UUID] = field(default_factory=list)
    sync_rcs: dict[str, int | None] = field(default_factory=dict)
    mode: str = "chain"  # the poll mode the workers run (Settings.poll_mode)
    # batch mode (reconcile.demo.claims): worker A's and B's liveness ids, the rows A held
    # claimed when it died (each with its claimer and its claim's lease end), when each of A's
    # liveness rows was reaped and by whom, and the poll_due ticks this process sent
    a_workers: set[str] = field(default_factory=set)
    b_workers: set[str] = field(default_factory=set)
    held_at_crash: dict[uuid.UUID, tuple[str, datetime]] = field(default_factory=dict)
    crashed_at: datetime | None = None
    a_reaped_at: dict[str, datetime] = field(default_factory=dict)
    reaped_by: dict[str, str] = field(default_factory=dict)
    poll_due_ticks: int = 0
    poll_due_discarded: int = 0  # expired poll_due messages the workers dropped unrun (logs)

    @property
    def crash_point(self) -> str:
        return BATCH_CRASH_POINT if self.mode == "batch" else CRASH_POINT

    def by_id(self) -> dict[uuid.UUID, Planned]:
        return dict(zip(self.ids, self.plans, strict=True))


# one line of the report's per-job table (reconcile.demo.report), which the checks read too
@dataclass
class Row:
    job_id: uuid.UUID
    plan: Planned
    status: str
    submission: str | None
    code: str | None
    creates: str
    reserved: int
    committed: int
    refunded: int
    how: str
