"""Internal: the completion as ONE statement (PostgreSQL, the built-in ledger).

The job's compare-and-set, the ledger's commit, the asset rows and the outbox event go out as
one statement of CTEs, in the order the two-statement path takes its locks:

1. ``j``: the job's row, ``FOR UPDATE``, only while it is in flight (the completion's guard,
   :func:`reconcile.jobstore.completion_cas`). A job already terminal gives no row, and nothing
   below runs: the ledger is never called for a lost race.
2. ``led``: the ledger's commit, the installed ``reconcile_ledger_commit`` function joined
   ``LATERAL`` to ``j`` (:mod:`reconcile.credits.inline`), so it runs only once the job's row is
   locked: it takes the user's balance lock, then commits what the settlement policy decided
   (``amount``; None: everything held) under it.
3. ``done``: the compare-and-set itself, from ``led``: ``credits_actual`` is the decided amount,
   or what the commit took when the policy left it to the ledger. A row is written once in the
   statement, so the cost is not a second write.
4. the asset rows and the event (:func:`reconcile.jobstore.completion_inserts`), only when the
   commit settled (``r_committed`` set). Otherwise (no balance row, a platform's own
   reservation, nothing held any more) the caller finishes with the two-statement path's
   steps in the same transaction: :func:`reconcile.ledger.commit_settled`, then the rows.

The amount is decided in Python (:func:`reconcile.settlement.decide`); a completion's amount
does not depend on what is held, and the commit reads what is held under the balance lock
inside the statement, so there is no stale read to compare against. A commit above what is held
writes nothing and raises (:class:`~reconcile.errors.LedgerError`), rolling the statement back
with the transaction, as before.

``tests/integration/test_completion_statement.py`` runs this path and the two-statement one on
random ledger histories and compares every table.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import BigInteger, bindparam, column, func, null, select, text, update
from sqlalchemy.orm import Session

from .. import jobstore
from ..credits import inline
from ..db.models import Job, JobEvent, table_of

_COLUMNS = ("output_data", "provider", "provider_cost", "completed_at", "progress", "error_code",
            "error_message", "reconcile_last_error")


@dataclass(frozen=True)
class Completed:
    """The statement's result: the completed row (mapped, in the session), and the ledger's
    settlement (None: the commit wrote nothing; the caller commits as the two-statement path
    does, then writes the rows)."""

    job: Job
    settlement: Any
    event_id: int | None


@lru_cache(maxsize=1)
def _statement() -> tuple[Any, tuple[str, ...]]:
    jobs = table_of(Job)
    guard, written = jobstore.completion_cas(**{name: None for name in _COLUMNS})
    j = (select(jobs.c.id).where(jobs.c.id == bindparam("job_id", type_=jobs.c.id.type), *guard)
         .with_for_update().cte("j"))
    call = inline.commit_call(j.c.id)
    led = select(j.c.id.label("locked_id"), *call.c).select_from(j.join(call, text("true"))) \
        .cte("led")
    amount = bindparam("amount", type_=BigInteger())
    cost = func.coalesce(amount, led.c.r_committed)
    values: dict[str, Any] = {}
    for name, value in written.items():
        if name in _COLUMNS:
            values[name] = bindparam(f"v_{name}", type_=jobs.c[name].type)
        else:  # the guard's fixed values (status, the cleared leases: NULL, not a bind)
            values[name] = null() if value is None else value
    values.update(credits_actual=cost, display_cost=cost)
    done = (update(jobs).where(jobs.c.id == led.c.locked_id, *guard).values(values)
            .returning(*jobs.c).cte("done"))
    settled = led.c.r_committed.is_not(None)
    asset_rows, event_row = jobstore.completion_inserts(
        done.c.id, done.c.user_id, source=done.join(led, text("true")), when=settled,
        credits_actual=done.c.credits_actual)
    assets = asset_rows.cte("assets")
    event = event_row.cte("event")
    event_id = column("event_row_id", event.c.id.type)
    extra = [*list(led.c)[1:], event_id]
    # the final select names no column: ``done.*`` is the job's row in RETURNING's order (its
    # mapped columns), ``led.*`` the lock's id and the ledger's columns, mapped by position.
    # Spelled out (``done.id AS id, …``) the statement was 6,016 bytes, over psycopg's
    # 4,096-byte limit for caching a statement's parsing: it was parsed again on every
    # completion (tests/integration/test_completion_statement.py holds it within the limit)
    main = (text("SELECT done.*, led.*, (SELECT event.id FROM event) AS event_row_id "
                 "FROM led JOIN done ON true")
            .columns(*jobs.c, *led.c, event_id).add_cte(j, led, done, assets, event))
    # the completed row mapped onto Job (as the poll turn's), the ledger's columns beside it
    return select(Job, *extra).from_statement(main), tuple(c.name for c in extra)


def usable(session: Session, ledger: Any, amount: int | None) -> bool:
    """Whether this completion may be one statement: PostgreSQL, the built-in ledger's own
    commit (:func:`reconcile.ledger.commits_inline`) and an amount its path takes."""
    from ..ledger import commits_inline

    return commits_inline(ledger) and inline.usable(session.connection(), amount)


def complete(session: Session, job_id: uuid.UUID, *, amount: int | None, now: datetime,
             values: Mapping[str, Any], assets: list[tuple[int, str, str | None]],
             is_public: bool, watermarked: bool, event: JobEvent) -> Completed | None:
    """Run the statement. None: the job was not in flight (lost; nothing written)."""
    statement, _ = _statement()
    params: dict[str, Any] = {"job_id": job_id, "amount": amount,
                              **{f"v_{name}": values.get(name) for name in _COLUMNS},
                              **inline.params(job_id, amount, now),
                              **jobstore.completion_binds(assets, is_public=is_public,
                                                          watermarked=watermarked, event=event,
                                                          now=now)}
    unknown = set(values) - set(_COLUMNS)
    if unknown:
        raise ValueError(f"the completion statement does not write {sorted(unknown)}")
    result = session.execute(statement, params, execution_options={"populate_existing": True})
    row = result.first()
    if row is None:
        return None
    _, names = _statement()
    extra = dict(zip(names, row[1:], strict=True))
    settlement = inline.outcome(session, job_id, amount, extra)
    return Completed(row[0], settlement, extra["event_row_id"])
