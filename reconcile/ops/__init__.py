"""Internal: the library's own mechanics, not an import path for platforms (may move).

The ``reconcile`` operator command (README, CLI); also ``python -m reconcile``.

Listings (``stuck``, ``uncertain``, ``unsettled``) and ``show`` print aligned tables for people
and, with ``--json``, one JSON value on stdout for scripts. Changes go through the lifecycle's
compare-and-set functions, never raw SQL: ``fail`` fails a job *with* its refund (marking a job
failed without it would leave its credits reserved), ``resolve`` settles an uncertain submission either way.

In JSON, times are ISO 8601 (UTC) and durations (``age``, ``threshold``, ``due_in``) seconds.

Exit codes: 0 done (or nothing to do), 1 an error — for ``audit`` discrepancies found, for
``sweep`` and ``adopt report`` a row not handled (``errors=N``), for ``db check`` a mismatch —,
2 a bad argument or a refused change (unknown job, an uncertain job given to ``fail``, …).

A platform can run the command with its own :class:`~reconcile.runtime.Runtime` (its hooks,
its enqueue functions): ``main(args, obj=runtime)``; tests do the same with ``CliRunner``.

The command lives in this package, one module a concern: :mod:`.app` (the root group, the
shared :class:`Cli` state, exit codes, options), :mod:`.output` (tables and JSON),
:mod:`.listings` (the read-only queries: ``stuck``, ``uncertain``, ``unsettled``, ``show``,
``audit``), :mod:`.actions` (``fail``, ``resolve``, ``sweep``, ``repair-usage-metadata``),
:mod:`.database` (``db upgrade|downgrade|check``), :mod:`.adopt` (``adopt report``, ``credits
import``, ``credits release-orphan``, ``prune``) and :mod:`.tools` (``simulator``, ``demo``,
``metrics``). Importing the package registers every command on :func:`main`; ``reconcile.cli``
re-exports it (the console script's entry point).
"""

from __future__ import annotations

from . import actions, adopt, database, listings, tools  # noqa: F401  (register the commands)
from .app import JOB_ID, NO_DATABASE, Cli, Failed, Refused, main

__all__ = ["JOB_ID", "NO_DATABASE", "Cli", "Failed", "Refused", "main"]
