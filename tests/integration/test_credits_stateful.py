"""Hypothesis stateful test: any sequence of ledger operations keeps the audit clean."""

from __future__ import annotations

import uuid

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule
from sqlalchemy import Engine, text

from reconcile import credits
from reconcile.db.models import Job
from reconcile.db.session import make_sessionmaker
from reconcile.errors import InsufficientCredits
from tests.conftest import TABLES


def make_machine(engine: Engine) -> type[RuleBasedStateMachine]:
    factory = make_sessionmaker(engine)

    class Ledger(RuleBasedStateMachine):
        jobs = Bundle("jobs")

        def __init__(self) -> None:
            super().__init__()
            with engine.begin() as conn:
                conn.execute(text("TRUNCATE " + ", ".join(TABLES)))
            self.users = [uuid.uuid4(), uuid.uuid4()]
            self.granted = 0

        @rule(user=st.integers(0, 1), pool=st.sampled_from(credits.POOLS), amount=st.integers(1, 500))
        def grant(self, user: int, pool: str, amount: int) -> None:
            with factory.begin() as s:
                assert credits.grant(s, self.users[user], pool, amount, f"g-{uuid.uuid4()}")

        @rule(target=jobs, user=st.integers(0, 1), amount=st.integers(1, 300))
        def reserve(self, user: int, amount: int) -> uuid.UUID:
            jid = uuid.uuid4()
            try:
                with factory.begin() as s:
                    s.add(Job(id=jid, user_id=self.users[user], job_type="t", status="pending"))
                    credits.reserve(s, self.users[user], jid, amount)
            except InsufficientCredits:
                pass
            return jid

        @rule(job=jobs, fraction=st.fractions(0, 1))
        def commit(self, job: uuid.UUID, fraction: object) -> None:
            with factory.begin() as s:
                log = credits._reserved_log(s, job)
                if log is None:
                    assert credits.commit(s, job) is False
                    return
                held = max(0, log.credits - credits.legacy_refunded(s, job))
                credits.commit(s, job, int(held * fraction))  # type: ignore[operator]

        @rule(job=jobs)
        def refund(self, job: uuid.UUID) -> None:
            with factory.begin() as s:
                first = credits.refund(s, job)
            with factory.begin() as s:
                assert credits.refund(s, job) is False or not first

        @rule(job=jobs, amount=st.integers(1, 100))
        def legacy_partial_refund(self, job: uuid.UUID, amount: int) -> None:
            with factory.begin() as s:
                log = credits._reserved_log(s, job)
                if log is None:
                    return
                held = max(0, log.credits - credits.legacy_refunded(s, job))
                if held == 0:
                    return
                credits.import_legacy_refund(s, job, min(amount, held), f"legacy-{uuid.uuid4()}")

        @invariant()
        def audit_is_clean(self) -> None:
            with factory() as s:
                assert credits.audit(s) == []

    return Ledger


def test_ledger_state_machine(pg_engine: Engine) -> None:
    """grant / reserve / commit (full and partial) / refund / legacy refund: audit always clean."""
    machine = make_machine(pg_engine)
    machine.TestCase.settings = settings(
        max_examples=30, stateful_step_count=25, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    machine.TestCase().runTest()
