"""Chain mode carries the provider's status from a read to the chain's next turn: the poll
message holds it (the Celery message's ``reconcile_provider_status`` header, beside the three
arguments a worker of an earlier release expects), the task hands it to ``poll_step``, and an
``enqueue_poll`` that takes no ``status`` keyword (a platform's or a test's own) still gets
its four arguments."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from reconcile import lifecycle, tasks
from reconcile.lifecycle import poll


class _Runtime:
    def __init__(self, enqueue: Any) -> None:
        self.enqueue_poll = enqueue


def test_a_status_goes_to_an_enqueue_that_takes_it() -> None:
    sent: list[tuple[Any, ...]] = []

    def enqueue(job_id: uuid.UUID, generation: int, seq: int, countdown: float,
                status: str | None = None) -> None:
        sent.append((job_id, generation, seq, countdown, status))

    job_id = uuid.uuid4()
    poll._enqueue_next(_Runtime(enqueue), job_id, 2, 5, 1.5, "processing")  # type: ignore[arg-type]
    poll._enqueue_next(_Runtime(enqueue), job_id, 2, 6, 1.5, None)  # type: ignore[arg-type]
    assert sent == [(job_id, 2, 5, 1.5, "processing"), (job_id, 2, 6, 1.5, None)]


@pytest.mark.parametrize("shape", ["function", "lambda", "method", "star_args"])
def test_an_enqueue_without_a_status_keyword_gets_its_four_arguments(shape: str) -> None:
    sent: list[tuple[Any, ...]] = []

    def four(job_id: uuid.UUID, generation: int, seq: int, countdown: float) -> None:
        sent.append((job_id, generation, seq, countdown))

    class Queue:
        def enqueue(self, job_id: uuid.UUID, generation: int, seq: int, countdown: float) -> None:
            four(job_id, generation, seq, countdown)

        __hash__ = None  # type: ignore[assignment]  # an unhashable owner: no signature cache

    def star(*args: Any) -> None:  # a wrapper forwarding to a four-argument send
        four(*args)

    enqueue = {"function": four, "lambda": lambda j, g, s, c: four(j, g, s, c),
               "method": Queue().enqueue, "star_args": star}[shape]
    job_id = uuid.uuid4()
    poll._enqueue_next(_Runtime(enqueue), job_id, 1, 3, 0.5, "processing")  # type: ignore[arg-type]
    assert sent == [(job_id, 1, 3, 0.5)]


def test_the_poll_task_hands_the_message_header_to_the_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The task's three arguments are unchanged; the status comes from the header (an eager
    run's request headers here; a worker's request holds them the same way)."""
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks, "get_runtime", lambda: "rt")
    monkeypatch.setattr(lifecycle, "poll_step",
                        lambda rt, job_id, generation, seq, status=None:
                        seen.append((rt, job_id, generation, seq, status)) or "in_flight")
    job_id = uuid.uuid4()
    tasks.poll.apply(args=[str(job_id), 4, 9], headers={tasks._STATUS_HEADER: "generating"})
    tasks.poll.apply(args=[str(job_id), 4, 10])  # a message from an earlier release: no header
    tasks.poll.apply(args=[str(job_id), 4, 11], headers={tasks._STATUS_HEADER: 17})  # no text
    assert seen == [("rt", job_id, 4, 9, "generating"), ("rt", job_id, 4, 10, None),
                    ("rt", job_id, 4, 11, None)]


def test_the_poll_message_holds_the_status_in_a_header_only(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[tuple[Any, ...]] = []
    monkeypatch.setattr(tasks, "send", lambda name, args, countdown=None, *, headers=None:
                        sent.append((name, args, headers)))
    job_id = uuid.uuid4()
    tasks.enqueue_poll(job_id, 3, 7, 0.0, status="processing")
    tasks.enqueue_poll(job_id, 3, 8, 0.0)
    assert sent == [
        ("reconcile.poll", [str(job_id), 3, 7], {tasks._STATUS_HEADER: "processing"}),
        ("reconcile.poll", [str(job_id), 3, 8], None),
    ]
