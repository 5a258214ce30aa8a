"""Output formatting of the ``reconcile`` command: aligned tables for people, one JSON value on
stdout (``--json``) for scripts. In JSON, times are ISO 8601 (UTC) and durations seconds.

Every value a person reads goes through :func:`_cell`, which escapes what a terminal would act
on (ESC/OSC sequences, other controls, bidi characters: :func:`reconcile.core.redact.for_terminal`):
a model, job type, provider message or upstream id is customer or provider text. Every value,
``--json`` included, first goes through the one redaction (:func:`reconcile.core.redact.text`):
a row written before a credential shape was known may still hold one."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import click

from ..core import redact
from ..core.redact import for_terminal


def _as_json(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _dump(value: Any) -> None:
    click.echo(json.dumps(redact.value(value), default=_as_json, indent=2))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, dict | list):
        text = json.dumps(redact.value(value), default=_as_json, separators=(",", ":"))
        return text if len(text) <= 120 else text[:117] + "..."  # ensure_ascii: escaped
    return for_terminal(redact.text(str(value)))


def _duration(delta: timedelta) -> str:
    """``3h05m``, ``12m30s``, ``45s``; negative durations get a leading ``-``."""
    seconds = int(delta.total_seconds())
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{sign}{hours}h{minutes:02d}m"
    if minutes:
        return f"{sign}{minutes}m{secs:02d}s"
    return f"{sign}{secs}s"


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Plain aligned columns under upper-case headers."""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _listing(rows: list[dict[str, Any]], columns: Sequence[str], as_json: bool, empty: str) -> None:
    if as_json:
        _dump(rows)
    elif rows:
        click.echo(_table(rows, columns))
    else:
        click.echo(empty)
