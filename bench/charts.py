"""ASCII charts for the Markdown report: they read in a diff and in a terminal. The PNGs beside
``latest.md`` (``bench/pictures.py``, matplotlib from the ``bench`` extra, kept out of ``test``)
draw the same data for a screen."""

from __future__ import annotations

import math
from collections.abc import Sequence


def bars(items: Sequence[tuple[str, float]], *, width: int = 50, unit: str = "",
         log: bool = False) -> str:
    """One horizontal bar per (label, value); ``log`` scales the bars by log10."""
    if not items:
        return ""
    label_w = max(len(label) for label, _ in items)

    def size(v: float) -> float:
        return math.log10(max(v, 1e-9)) if log else v

    lo = min(0.0, min(size(v) for _, v in items) - (1.0 if log else 0.0))
    hi = max(size(v) for _, v in items)
    span = (hi - lo) or 1.0
    lines = []
    for label, value in items:
        n = max(1, round((size(value) - lo) / span * width))
        lines.append(f"{label.ljust(label_w)} |{'█' * n} {value:g}{unit}")
    if log:
        lines.append(f"{''.ljust(label_w)}  (bar length ∝ log10)")
    return "\n".join(lines)


def xy(points: Sequence[tuple[float, float]], *, width: int = 60, height: int = 14,
       x_label: str = "", y_label: str = "", log_x: bool = False) -> str:
    """A scatter/line of (x, y) points on a character grid."""
    pts = [(math.log10(x) if log_x else x, y) for x, y in points if not log_x or x > 0]
    if len(pts) < 2:
        return ""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(0.0, min(ys)), max(ys)
    x_span, y_span = (x1 - x0) or 1.0, (y1 - y0) or 1.0
    grid = [[" "] * width for _ in range(height)]
    for x, y in pts:
        col = min(width - 1, round((x - x0) / x_span * (width - 1)))
        row = min(height - 1, round((y - y0) / y_span * (height - 1)))
        grid[height - 1 - row][col] = "•"
    y_w = max(len(f"{y1:g}"), len(f"{y0:g}"))
    lines = []
    for i, row in enumerate(grid):
        tick = f"{y1:g}" if i == 0 else (f"{y0:g}" if i == height - 1 else "")
        lines.append(f"{tick.rjust(y_w)} ┤{''.join(row)}")
    lines.append(" " * y_w + " └" + "─" * width)
    left = f"{10 ** x0:g}" if log_x else f"{x0:g}"
    right = f"{10 ** x1:g}" if log_x else f"{x1:g}"
    lines.append(" " * (y_w + 2) + left + " " * max(1, width - len(left) - len(right)) + right)
    caption = f"x: {x_label}{' (log)' if log_x else ''}   y: {y_label}"
    lines.append(" " * (y_w + 2) + caption)
    return "\n".join(lines)


def histogram(values: Sequence[float], *, bins: int = 12, width: int = 40, unit: str = "") -> str:
    """Counts of ``values`` in equal-width bins, one bar per bin."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / span * bins))] += 1
    top = max(counts) or 1
    lines = []
    for i, c in enumerate(counts):
        a, b = lo + span * i / bins, lo + span * (i + 1) / bins
        label = f"{a:7.1f}–{b:7.1f}{unit}"
        lines.append(f"{label} |{'█' * round(c / top * width)} {c}")
    return "\n".join(lines)
