"""The benchmark profile's watched functions name files that exist.

``bench/fig_drain.py``'s ``_WATCH`` sums cProfile's cumulative time of each ``(file suffix,
function)``; a suffix that names no file matches nothing and its row reads 0 ms, silently. The
layout move (2265f5d) moved ``reconcile/media.py`` and ``reconcile/events.py`` into packages
and left two such rows behind. ``bench/profiles.py``'s ``LAYERS`` is checked the same way for
its ``reconcile/`` entries (today it has none).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench import fig_drain, profiles

ROOT = Path(__file__).resolve().parents[2]

WATCHED = [(label, path, func) for label, (path, func) in fig_drain._WATCH.items()
           if path.startswith("reconcile/")]
LAYERED = [(label, path, func) for label, path, func in profiles.LAYERS
           if path.startswith("reconcile/")]


def _defines(path: Path, func: str) -> bool:
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == func
               for node in ast.walk(ast.parse(path.read_text())))


def test_the_profile_watches_library_functions() -> None:
    assert len(WATCHED) >= 8


@pytest.mark.parametrize(("label", "path", "func"), WATCHED + LAYERED)
def test_each_watched_library_function_exists_where_the_profile_looks(
        label: str, path: str, func: str) -> None:
    file = ROOT / path
    assert file.is_file(), f"{label}: {path} does not exist"
    assert _defines(file, func), f"{label}: {path} defines no {func}"


def test_the_poll_profile_can_drop_the_batch_pollers_thread_pools() -> None:
    """``make bench-profile`` shuts the batch poller's thread pools before it profiles the reads
    (so their threads start inside the profile). It looked for them where they were before they
    moved to ``reconcile.lifecycle.batch_reads`` and raised ``AttributeError``, so every
    ``make bench-profile`` failed after its first figure, unnoticed."""
    from bench import poll_modes
    from reconcile.lifecycle import batch_reads

    batch_reads.finalize_pool(2).submit(lambda: None).result()
    assert batch_reads._POOLS
    poll_modes._drop_read_pools()
    assert not batch_reads._POOLS
