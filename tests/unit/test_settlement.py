"""The settlement policy (reconcile.settlement), database-free and table-driven: what a
finished job commits and refunds, today's rules and a configured 50 % cancel refund."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from reconcile.errors import LedgerError
from reconcile.settlement import (
    DEFAULT_POLICY,
    MAX_SHARE_DENOMINATOR,
    Decision,
    Finished,
    SettlementPolicy,
    SettleOutcome,
    decide,
)

HALF_CANCEL = SettlementPolicy(cancel_refund=Fraction(1, 2))

# (finished, reserved, priced, policy) -> (commit, refund, reason, notes, full_refund)
TABLE: list[tuple[str, int | None, Any, SettlementPolicy, tuple[Any, ...]]] = [
    # completion without a price: all that is held, whether the caller knows it or not
    ("completed", None, None, DEFAULT_POLICY, (None, 0, "completed_all_held", (), False)),
    ("completed", 40, None, DEFAULT_POLICY, (None, 0, "completed_all_held", (), False)),
    # priced below / equal to / zero of what is held: the rest goes back
    ("completed", 40, 25, DEFAULT_POLICY, (25, 15, "completed_priced", (), False)),
    ("completed", 40, 40, DEFAULT_POLICY, (40, 0, "completed_priced", (), False)),
    ("completed", 40, 0, DEFAULT_POLICY, (0, 40, "completed_priced", ("priced_zero",), False)),
    # priced, what is held unknown to the caller (finalize): the ledger works out the rest
    ("completed", None, 25, DEFAULT_POLICY, (25, None, "completed_priced", (), False)),
    ("completed", None, 41, DEFAULT_POLICY, (41, None, "completed_priced", (), False)),
    # not whole credits: passed through for the ledger (or the completion CAS) to refuse
    ("completed", 40, -1, DEFAULT_POLICY, (-1, None, "completed_priced", ("not_whole_credits",), False)),
    ("completed", 40, True, DEFAULT_POLICY, (True, None, "completed_priced", ("not_whole_credits",), False)),
    ("completed", 40, 2.5, DEFAULT_POLICY, (2.5, None, "completed_priced", ("not_whole_credits",), False)),
    ("completed", None, "7", DEFAULT_POLICY, ("7", None, "completed_priced", ("not_whole_credits",), False)),
    ("completed", 40, Decimal(5), DEFAULT_POLICY,
     (Decimal(5), None, "completed_priced", ("not_whole_credits",), False)),
    # the cancel/failure policy does not touch completions
    ("completed", 40, 25, HALF_CANCEL, (25, 15, "completed_priced", (), False)),
    # failure and cancel: everything back by default, known or not
    ("failed", None, None, DEFAULT_POLICY, (0, None, "failed_refunded", (), True)),
    ("failed", 40, None, DEFAULT_POLICY, (0, 40, "failed_refunded", (), True)),
    ("cancelled", None, None, DEFAULT_POLICY, (0, None, "cancelled_refunded", (), True)),
    ("cancelled", 40, None, DEFAULT_POLICY, (0, 40, "cancelled_refunded", (), True)),
    # a price is ignored for a job that did not complete
    ("failed", 40, 25, DEFAULT_POLICY, (0, 40, "failed_refunded", (), True)),
    # the change request: a 50 % cancel refund (a half credit goes to the user)
    ("cancelled", 40, None, HALF_CANCEL, (20, 20, "cancelled_partly_refunded", ("refund_share=1/2",), False)),
    ("cancelled", 41, None, HALF_CANCEL, (20, 21, "cancelled_partly_refunded", ("refund_share=1/2",), False)),
    ("cancelled", 1, None, HALF_CANCEL, (0, 1, "cancelled_partly_refunded", ("refund_share=1/2",), False)),
    ("cancelled", 0, None, HALF_CANCEL, (0, 0, "cancelled_partly_refunded", ("refund_share=1/2",), False)),
    ("failed", 40, None, HALF_CANCEL, (0, 40, "failed_refunded", (), True)),  # failures: still all
    ("failed", 9, None, SettlementPolicy(failure_refund=Fraction(0)),
     (9, 0, "failed_partly_refunded", ("refund_share=0",), False)),
    ("failed", 10, None, SettlementPolicy(failure_refund=Fraction(1, 3)),
     (6, 4, "failed_partly_refunded", ("refund_share=1/3",), False)),
]


@pytest.mark.parametrize(("finished", "reserved", "priced", "policy", "expected"), TABLE)
def test_decide(finished: str, reserved: int | None, priced: Any, policy: SettlementPolicy,
                expected: tuple[Any, ...]) -> None:
    d = decide(finished, reserved=reserved, priced=priced, policy=policy)
    assert isinstance(d, Decision)
    got = (d.commit, d.refund, d.reason, d.notes, d.full_refund)
    assert got == expected
    assert type(d.commit) is type(expected[0])  # passed through as priced (True stays a bool)
    if reserved is not None and d.refund is not None and d.commit is not None:
        assert d.commit + d.refund == reserved  # nothing created, nothing lost


def test_a_price_above_a_known_reservation_is_refused_never_clamped() -> None:
    with pytest.raises(LedgerError) as err:
        decide(Finished.COMPLETED, reserved=40, priced=41)
    assert err.value.reason == "commit_exceeds_held" and "cannot commit 41" in str(err.value)


def test_a_partial_refund_needs_the_reserved_amount() -> None:
    with pytest.raises(ValueError, match="needs the reserved amount"):
        decide("cancelled", policy=HALF_CANCEL)


def test_unknown_terminal_state_is_refused() -> None:
    with pytest.raises(ValueError):
        decide("processing", reserved=40)


@pytest.mark.parametrize("share", [Fraction(-1, 2), Fraction(3, 2), 0.5, True, "1", Decimal("0.5")])
def test_policy_shares_are_exact_fractions_between_0_and_1(share: Any) -> None:
    with pytest.raises(ValueError):
        SettlementPolicy(cancel_refund=share)


def test_a_share_denominator_is_at_most_nine_digits() -> None:
    """Above it, the audit could not recompute the share exactly on SQLite (a false alarm for
    every such settlement) nor the policy's own in 64-bit SQL (an overflow): refused at once."""
    assert SettlementPolicy(cancel_refund=Fraction(1, MAX_SHARE_DENOMINATOR)).cancel_refund \
        == Fraction(1, 999_999_999)
    with pytest.raises(ValueError, match="denominator above 999,999,999"):
        SettlementPolicy(failure_refund=Fraction(1, MAX_SHARE_DENOMINATOR + 1))
    with pytest.raises(ValueError, match="cancel_refund"):
        SettlementPolicy(cancel_refund=Fraction(999_999_999_999_999_988, 999_999_999_999_999_989))
    # a large numerator and denominator in lowest terms below the bound are fine
    assert SettlementPolicy(cancel_refund=Fraction(2_000_000_000, 4_000_000_000)).cancel_refund \
        == Fraction(1, 2)


def test_policy_accepts_integer_shares_as_fractions_and_is_frozen() -> None:
    policy = SettlementPolicy(cancel_refund=0)  # type: ignore[arg-type]
    assert policy.cancel_refund == Fraction(0) and isinstance(policy.cancel_refund, Fraction)
    with pytest.raises(AttributeError):
        policy.cancel_refund = Fraction(1)  # type: ignore[misc]
    assert DEFAULT_POLICY == SettlementPolicy(Fraction(1), Fraction(1))


def test_settle_outcomes_are_distinct_strings() -> None:
    assert [str(o) for o in SettleOutcome] == ["settled", "already_settled", "not_due", "backed_off"]


@pytest.mark.parametrize(("finished", "reserved", "policy", "record"), [
    ("cancelled", 40, HALF_CANCEL, {"status": "cancelled", "refund_share": "1/2"}),
    ("failed", 9, SettlementPolicy(failure_refund=Fraction(0)),
     {"status": "failed", "refund_share": "0/1"}),
    ("failed", 10, SettlementPolicy(failure_refund=Fraction(2, 6)),
     {"status": "failed", "refund_share": "1/3"}),
    ("cancelled", 40, DEFAULT_POLICY, None),  # a full refund: the ledger's refund, no record
    ("failed", 40, HALF_CANCEL, None),
])
def test_a_partial_refund_carries_its_record(finished: str, reserved: int,
                                             policy: SettlementPolicy, record: Any) -> None:
    """What the ledger records with the commit (it adds ``kept``): how the job ended and the
    share refunded as an exact fraction string; completions and full refunds record nothing."""
    assert decide(finished, reserved=reserved, policy=policy).record == record
    assert decide("completed", reserved=40, priced=25).record is None


class _ComparesAsAHalf(Fraction):
    """A Fraction subclass whose numerator and denominator say 5/4 while it compares as the
    1/2 it was built from (its comparisons read the private fields)."""

    @property
    def numerator(self) -> int:  # type: ignore[override]
        return 5

    @property
    def denominator(self) -> int:  # type: ignore[override]
        return 4


class _AlwaysInRange(int):
    def __le__(self, other: object) -> bool:
        return True

    def __ge__(self, other: object) -> bool:
        return True


@pytest.mark.parametrize("share", [_ComparesAsAHalf(1, 2), _AlwaysInRange(7)])
def test_a_share_is_checked_as_the_fraction_stored(share: Any) -> None:
    """The range was checked on the value given and the converted Fraction stored: a subclass
    that compares in range but converts to 5/4 or 7 was stored as that (on main)."""
    with pytest.raises(ValueError, match="between 0 and 1"):
        SettlementPolicy(cancel_refund=share)
