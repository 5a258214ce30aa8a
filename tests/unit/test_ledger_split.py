"""The ledger's pure pool arithmetic, database-free and table-driven: the FIFO walk over lots
(:func:`credits.take_from_lots`, which reserve's Core path runs page by page), the in-order
split of a commit or legacy refund over the pools (:func:`credits.take_in_order`) and the
pro-rata split (:func:`credits.split_pro_rata`, used by the usage-metadata import)."""

from __future__ import annotations

import pytest

from reconcile import credits
from reconcile.errors import LedgerError

LOTS = [(1, 10), (2, 5), (3, 20)]

FIFO = [  # (amount, lots) -> (changes, taken)
    (0, LOTS, ([], 0)),
    (4, LOTS, ([(1, 6)], 4)),
    (10, LOTS, ([(1, 0)], 10)),  # exactly the first lot: the next is not touched
    (11, LOTS, ([(1, 0), (2, 4)], 11)),
    (35, LOTS, ([(1, 0), (2, 0), (3, 0)], 35)),
    (40, LOTS, ([(1, 0), (2, 0), (3, 0)], 35)),  # the lots run out: 5 short
    (3, [], ([], 0)),
]


@pytest.mark.parametrize(("amount", "lots", "expected"), FIFO)
def test_take_from_lots(amount: int, lots: list[tuple[int, int]],
                        expected: tuple[list[tuple[int, int]], int]) -> None:
    changes, taken = credits.take_from_lots(amount, lots)
    assert (changes, taken) == expected
    assert taken == sum(r for _, r in lots[:len(changes)]) - sum(left for _, left in changes)


IN_ORDER = [  # (amount, available, order) -> taken
    (0, (30, 10), (0, 1), (0, 0)),
    (25, (30, 10), (0, 1), (25, 0)),  # sub first
    (30, (30, 10), (0, 1), (30, 0)),
    (35, (30, 10), (0, 1), (30, 5)),
    (40, (30, 10), (0, 1), (30, 10)),
    (5, (30, 10), (1, 0), (0, 5)),  # the reverse order (legacy imports: topup first)
    (15, (30, 10), (1, 0), (5, 10)),
    (5, (-3, 10), (0, 1), (0, 5)),  # a negative pool gives nothing
]


@pytest.mark.parametrize(("amount", "available", "order", "expected"), IN_ORDER)
def test_take_in_order(amount: int, available: tuple[int, int], order: tuple[int, int],
                       expected: tuple[int, int]) -> None:
    assert credits.take_in_order(amount, available, order) == expected


def test_take_in_order_refuses_more_than_available() -> None:
    with pytest.raises(LedgerError):
        credits.take_in_order(41, (30, 10))


PRO_RATA = [  # (amount, from_sub, from_topup) -> (sub, topup)
    (40, 30, 10, (30, 10)),
    (10, 30, 10, (8, 2)),  # topup rounds down, the remainder goes to sub
    (7, 1, 1, (4, 3)),
    (5, 0, 10, (0, 5)),
    (5, 10, 0, (5, 0)),
    (5, 0, 0, (5, 0)),  # nothing to split by: all to sub
    (0, 3, 7, (0, 0)),
]


@pytest.mark.parametrize(("amount", "from_sub", "from_topup", "expected"), PRO_RATA)
def test_split_pro_rata(amount: int, from_sub: int, from_topup: int,
                        expected: tuple[int, int]) -> None:
    got = credits.split_pro_rata(amount, from_sub, from_topup)
    assert got == expected and sum(got) == amount
