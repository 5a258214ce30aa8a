"""Internal: ``reconcile.cli``: the ``reconcile`` console script's entry point (``reconcile.cli:main``) and
``from reconcile.cli import main`` for platforms and tests. The command itself lives in
:mod:`reconcile.ops` (listings, actions, db, adoption, output formatting).
"""

from __future__ import annotations

import sys

from .ops import JOB_ID, NO_DATABASE, Cli, Failed, Refused, main

__all__ = ["JOB_ID", "NO_DATABASE", "Cli", "Failed", "Refused", "main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
