"""``python -m reconcile.demo``: the crash-and-money story (see :mod:`reconcile.demo`)."""

from .story import main

if __name__ == "__main__":
    raise SystemExit(main())
