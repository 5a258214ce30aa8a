"""``python -m reconcile.testing.explorer`` (see :mod:`reconcile.testing.explorer`)."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
