"""Internal: the library's own mechanics, not an import path for platforms (may move).

Count the database round trips of lifecycle steps: statements, transactions, checkouts.

Used by ``bench/fig_statements.py`` (figure 5) and ``tests/integration/test_round_trips.py``.
A ``before_cursor_execute`` listener counts every statement sent, bucketed by the current step
name; the ``begin`` connection event counts transactions (a read session's autobegin counts
too); the pool's ``checkout`` event counts connection checkouts (one more than
``db.session.PING_AFTER_IDLE`` after the connection's previous checkout costs a ping round
trip, which the cursor listener does not see)::

    counting = Counting(engine)
    with counting.step_named("submit"):
        lifecycle.submit_job(...)
    counting.of("submit")  # {"statements": …, "transactions": …, "checkouts": …}
    counting.close()       # detach the listeners (a shared engine)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event


class Counting:
    """Statements, transactions and checkouts per named step (``step``: the current one)."""

    def __init__(self, engine: Any, *, sample_width: int = 90) -> None:
        self.engine = engine
        self.step = "setup"
        self.sample_width = sample_width
        self.statements: Counter[str] = Counter()
        self.transactions: Counter[str] = Counter()
        self.checkouts: Counter[str] = Counter()
        self.samples: dict[str, list[str]] = {}
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "begin", self._begin)
        event.listen(engine.pool, "checkout", self._checkout)

    def _statement(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements[self.step] += 1
        self.samples.setdefault(self.step, []).append(" ".join(statement.split())[:self.sample_width])

    def _begin(self, conn: Any) -> None:
        self.transactions[self.step] += 1

    def _checkout(self, *args: Any) -> None:
        self.checkouts[self.step] += 1

    @contextmanager
    def step_named(self, name: str) -> Iterator[None]:
        """Count what runs inside under ``name`` (then back to the previous step)."""
        previous, self.step = self.step, name
        try:
            yield
        finally:
            self.step = previous

    def of(self, step: str) -> dict[str, int]:
        return {"statements": self.statements[step], "transactions": self.transactions[step],
                "checkouts": self.checkouts[step]}

    def texts(self, step: str) -> list[str]:
        return list(self.samples.get(step, []))

    def clear(self) -> None:
        self.statements.clear()
        self.transactions.clear()
        self.checkouts.clear()
        self.samples.clear()

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._statement)
        event.remove(self.engine, "begin", self._begin)
        event.remove(self.engine.pool, "checkout", self._checkout)

    def __enter__(self) -> Counting:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
