"""Give a user credits: ``python -m acme.grant USER_ID AMOUNT [--pool sub|topup] [--ref REF]``."""

from __future__ import annotations

import argparse
import uuid

from reconcile import credits

from .runtime import build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m acme.grant")
    parser.add_argument("user_id", type=uuid.UUID)
    parser.add_argument("amount", type=int)
    parser.add_argument("--pool", choices=credits.POOLS, default="sub")
    parser.add_argument("--ref", help="idempotency key (default: a fresh one)")
    args = parser.parse_args(argv)
    rt = build()
    ref = args.ref or f"acme-grant:{uuid.uuid4()}"
    with rt.sessions.begin() as session:
        added = credits.grant(session, args.user_id, args.pool, args.amount, ref)
        balance = credits.lock_balance(session, args.user_id)
        print(f"{'granted' if added else 'already granted'} {args.amount} ({args.pool}) to "
              f"{args.user_id} [{ref}]; balance sub={balance.sub} topup={balance.topup}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
