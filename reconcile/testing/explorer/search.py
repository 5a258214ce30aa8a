"""Internal: the explorer's tree of schedules (see :mod:`reconcile.testing.explorer`).

The default policy (go on with the writer that ran last), what a preemption costs, and the
children of a run within the preemption and clock-jump bounds: each schedule generated once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .model import Bounds, Context, Decision, Writer


def _bind(writer: Writer, rt: Any, ctx: Context) -> Callable[[], str]:
    return lambda: writer.run(rt, ctx)


def _available(choice: str, enabled: list[int], ahead: tuple[int, ...]) -> bool:
    if choice.startswith("t"):
        return int(choice[1:]) in ahead
    return int(choice) in enabled


def _default(last: int | None, enabled: list[int]) -> str:
    """Go on with the writer that ran last if it can; else the lowest-numbered one."""
    return str(last if last in enabled else enabled[0])


def _cost(d: Decision, writer: int) -> int:
    return 1 if d.last_parked and d.last is not None and writer != d.last else 0


def _children(prefix: tuple[str, ...], decisions: Sequence[Decision],
              bounds: Bounds) -> list[tuple[str, ...]]:
    """The unexplored schedules that branch off this run within the bounds.

    Positions inside ``prefix`` were branched by the runs that produced it, so only later ones
    branch here — each schedule is generated once. A clock jump goes right before a step that
    reads the clock: before the chosen writer's step when it read it (known from this run), and
    before the last prefix step when that one read it (the child that chose it finds out).
    """
    chosen = [d.chosen for d in decisions]
    out: list[tuple[str, ...]] = []
    p = len(prefix)
    for k, d in enumerate(decisions):
        if d.chosen.startswith("t"):
            continue
        after_jump = k > 0 and chosen[k - 1].startswith("t")
        if k >= p:
            for w in d.writers:
                if str(w) != d.chosen and d.preemptions + _cost(d, w) <= bounds.preemptions:
                    out.append(tuple(chosen[:k]) + (str(w),))
        if (k >= p or k == p - 1) and not after_jump and d.clock_read \
                and d.jumps < bounds.jumps:
            for mark in d.marks:
                out.append(tuple(chosen[:k]) + (f"t{mark}", d.chosen))
    return out
