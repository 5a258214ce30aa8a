"""``python -m reconcile.testing.chaos``: a seeded chaos run (see :mod:`reconcile.testing.chaos`)."""

from .run import main

if __name__ == "__main__":
    raise SystemExit(main())
