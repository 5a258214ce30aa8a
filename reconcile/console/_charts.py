"""Internal: the health page's charts, drawn on the server as SVG (no script, no style
attribute: the console's Content-Security-Policy allows neither). Labels are escaped; values
are numbers."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from markupsafe import Markup

WIDTH, HEIGHT = 640, 220
PAD_L, PAD_R, PAD_T, PAD_B = 48, 12, 16, 48


def bars(values: Sequence[tuple[str, float]], *, title: str, unit: str = "") -> Markup:
    """A bar chart of ``(label, value)`` pairs, left to right; every label under its bar when
    there is room, else every n-th. An empty series draws the axes and says so."""
    plot_w, plot_h = WIDTH - PAD_L - PAD_R, HEIGHT - PAD_T - PAD_B
    top = max((v for _, v in values), default=0) or 1
    n = max(len(values), 1)
    step = plot_w / n
    every = max(1, int(n * 42 / plot_w) + 1)  # a label takes about 42 px
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<line x1="{PAD_L}" y1="{PAD_T + plot_h}" x2="{WIDTH - PAD_R}" y2="{PAD_T + plot_h}" '
        'stroke="#555"/>',
        f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{PAD_T + plot_h}" stroke="#555"/>',
        f'<text x="{PAD_L - 6}" y="{PAD_T + 4}" text-anchor="end" font-size="11">'
        f"{_num(top)}{escape(unit)}</text>",
        f'<text x="{PAD_L - 6}" y="{PAD_T + plot_h}" text-anchor="end" font-size="11">0</text>',
    ]
    if not values:
        parts.append(f'<text x="{PAD_L + plot_w / 2:.1f}" y="{PAD_T + plot_h / 2:.1f}" '
                     'text-anchor="middle" font-size="13" fill="#555">no data</text>')
    for i, (label, value) in enumerate(values):
        h = plot_h * (value / top)
        x = PAD_L + i * step + step * 0.1
        parts.append(f'<rect x="{x:.1f}" y="{PAD_T + plot_h - h:.1f}" width="{step * 0.8:.1f}" '
                     f'height="{h:.1f}" fill="#3b6ea5"><title>{escape(label)}: {_num(value)}'
                     f"{escape(unit)}</title></rect>")
        if i % every == 0:
            cx = PAD_L + i * step + step / 2
            parts.append(f'<text x="{cx:.1f}" y="{PAD_T + plot_h + 14}" text-anchor="end" '
                         f'font-size="10" transform="rotate(-35 {cx:.1f} {PAD_T + plot_h + 14})">'
                         f"{escape(label)}</text>")
    parts.append("</svg>")
    return Markup("".join(parts))


def _num(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def histogram(samples: Sequence[float], edges: Sequence[float], *, title: str,
              unit: str = "s") -> Markup:
    """``samples`` counted into the bins between ``edges`` (the last bin open-ended)."""
    counts = [0] * len(edges)
    for value in samples:
        slot = 0
        for i, edge in enumerate(edges):
            if value >= edge:
                slot = i
        counts[slot] += 1
    labels = [f"≥{_num(e)}{unit}" for e in edges]
    return bars(list(zip(labels, counts, strict=True)), title=title)
