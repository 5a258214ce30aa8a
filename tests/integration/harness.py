"""A lifecycle harness for tests: a Runtime on real PostgreSQL, the simulator over loopback, a
local storage folder, and in-memory queues of the create/poll steps a Celery worker would run.

``drain()`` runs queued steps (ignoring countdowns) the way workers would, so behaviour tests
need no broker; the Celery tests use the real tasks instead.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from reconcile import Runtime, credits, lifecycle
from reconcile.storage import LocalStorage
from reconcile.testing.simulator import Simulator


@dataclass
class Queues:
    creates: deque[uuid.UUID] = field(default_factory=deque)
    polls: deque[tuple[uuid.UUID, int, int]] = field(default_factory=deque)
    create_calls: int = 0
    poll_calls: int = 0

    def enqueue_create(self, job_id: uuid.UUID, countdown: float = 0.0) -> None:
        self.create_calls += 1
        self.creates.append(job_id)

    def enqueue_poll(self, job_id: uuid.UUID, generation: int, seq: int, countdown: float) -> None:
        self.poll_calls += 1
        self.polls.append((job_id, generation, seq))


class Clock:
    """A settable clock (aware UTC)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        from datetime import timedelta

        self.now += timedelta(**delta)
        return self.now


# the ledger backend a parametrized test runs with (tests.integration.ledgers.Backend); empty:
# the built-in ledger. make_runtime, fund and audit follow it.
_BACKEND: list[Any] = []


@contextmanager
def ledger_backend(backend: Any) -> Iterator[Any]:
    _BACKEND.append(backend)
    try:
        yield backend
    finally:
        _BACKEND.remove(backend)


def backend() -> Any | None:
    return _BACKEND[-1] if _BACKEND else None


def audit(session: Session, now: datetime | None = None) -> list[Any]:
    """The library's audit through the current backend (built-in: credits.audit and more)."""
    from reconcile.ledger import DEFAULT, audit as library_audit

    current = backend()
    return library_audit(current.ledger if current is not None else DEFAULT, session, now=now)


def make_runtime(db: sessionmaker[Session], sim: Simulator, tmp: Path, *, clock: Any = None,
                 **settings: Any) -> tuple[Runtime, Queues]:
    queues = Queues()
    current = backend()
    # this harness steps the poll chain's messages (``drain``): chain mode unless a test asks
    # for batch (the batch poller's own tests drive ``lifecycle.batch`` with poll_mode="batch")
    settings.setdefault("poll_mode", "chain")
    rt = Runtime(
        settings=sim.settings(webhook_base_url="https://platform.example/hooks", **settings),
        sessions=db,
        storage=LocalStorage(tmp / "media"),
        enqueue_create=queues.enqueue_create,
        enqueue_poll=queues.enqueue_poll,
        **({"ledger": current.ledger} if current is not None else {}),
    )
    if clock is not None:
        rt.clock = clock
    return rt, queues


def clocked_runtime(db: sessionmaker[Session], sim: Simulator, tmp: Path,
                    start: datetime) -> tuple[Runtime, Queues, Clock]:
    """:func:`make_runtime` on a :class:`Clock` standing at ``start``: the ``env`` fixture of
    the gateway-helper tests (runtime, queued messages, clock)."""
    clock = Clock(start)
    rt, queues = make_runtime(db, sim, tmp, clock=clock)
    return rt, queues, clock


def drain(rt: Runtime, queues: Queues, *, max_steps: int = 200, sleep: float = 0.0) -> int:
    """Run queued steps until none are left (or ``max_steps``); returns steps run. Batch mode:
    the creates, then the batch poller's claims (every row in flight is claimed whatever its
    due time, as the chain's queued turns run whatever their countdown) until none is left."""
    import time

    if rt.settings.poll_mode == "batch":
        return _drain_batch(rt, queues, max_steps=max_steps)
    steps = 0
    while (queues.creates or queues.polls) and steps < max_steps:
        if queues.creates:
            lifecycle.create_step(rt, queues.creates.popleft())
        else:
            job_id, generation, seq = queues.polls.popleft()
            lifecycle.poll_step(rt, job_id, generation, seq)
            if sleep:
                time.sleep(sleep)
        steps += 1
    return steps


def fund(db: sessionmaker[Session], user: uuid.UUID, amount: int = 1000, pool: str = "sub") -> None:
    current = backend()
    if current is not None:
        current.fund(user, amount, pool)
        return
    with db.begin() as s:
        credits.grant(s, user, pool, amount, f"grant-{uuid.uuid4()}")


def balance(db: sessionmaker[Session], user: uuid.UUID) -> tuple[int, int]:
    """The built-in ledger's (sub, topup) balance of ``user`` ((0, 0) without a balance row)."""
    from reconcile.db.models import CreditBalance

    with db() as s:
        b = s.get(CreditBalance, user)
        return (b.sub, b.topup) if b else (0, 0)


def use_policy(rt: Runtime, policy: Any) -> Runtime:
    """Deploy ``policy`` (a ``SettlementPolicy``) to ``rt`` the only way a Runtime takes one:
    through its settings (``RECONCILE_FAILURE_REFUND`` / ``CANCEL_REFUND``), as a restart
    with a new configuration would."""
    rt.settings = rt.settings.model_copy(update={"failure_refund": policy.failure_refund,
                                                 "cancel_refund": policy.cancel_refund})
    return rt


def _drain_batch(rt: Runtime, queues: Queues, *, max_steps: int) -> int:
    from datetime import timedelta

    from reconcile.lifecycle import batch

    steps = 0
    while queues.creates and steps < max_steps:
        lifecycle.create_step(rt, queues.creates.popleft())
        steps += 1
    while steps < max_steps:
        # claimed "a year from now": due whatever its time (run_claims schedules the next read
        # from the runtime's own clock, so a row still running is claimable again)
        claims = batch.claim(rt, now=rt.now() + timedelta(days=365))
        if not claims:
            break
        batch.run_claims(rt, claims)
        steps += len(claims)
    return steps
