"""Charts as inline SVG, drawn on the server: no chart library and no
script. Only numbers and escaped labels go into the markup; colours come
from classes in the stylesheet (the CSP's style-src 'self' blocks inline
style attributes). A chart's viewBox is the size it is drawn at on the
page, so its text is not stretched: callers pass the width they lay out.
"""
from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple

from markupsafe import Markup, escape

Series = Tuple[str, Sequence[Optional[float]], str]   # label, values, css class

PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 52, 8, 10, 20


def _nice_max(value: float) -> float:
    """A round ceiling for the y axis (1, 2, 2.5 or 5 times a power of ten)."""
    if value <= 0:
        return 1.0
    exponent = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5):
        if step * exponent >= value:
            return step * exponent
    return 10 * exponent


def _segments(values: Sequence[Optional[float]]) -> List[List[Tuple[int, float]]]:
    """Runs of consecutive known values (a gap breaks the line)."""
    runs: List[List[Tuple[int, float]]] = []
    current: List[Tuple[int, float]] = []
    for i, value in enumerate(values):
        if value is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append((i, float(value)))
    if current:
        runs.append(current)
    return runs


def nice_bytes(value: float) -> float:
    """A round ceiling for an axis of bytes (1, 2, 2.5 or 5 times a power of
    ten of MB, as size() prints them)."""
    mb = 1024 * 1024
    return _nice_max(value / mb) * mb


def line_chart(series: Sequence[Series], *, title: str, x_left: str, x_right: str,
               y_format: Callable[[float], str] = lambda v: f"{v:g}",
               y_ceiling: Callable[[float], float] = _nice_max, width: int = 640,
               height: int = 150, area: bool = False) -> Markup:
    """A line chart of equally spaced points; None values leave gaps."""
    count = max((len(values) for _, values, _ in series), default=0)
    known = [v for _, values, _ in series for v in values if v is not None]
    top = y_ceiling(max(known)) if known and max(known) > 0 else 1.0
    plot_w = width - PAD_LEFT - PAD_RIGHT
    plot_h = height - PAD_TOP - PAD_BOTTOM

    def x(i: int) -> float:
        return PAD_LEFT + (plot_w * i / (count - 1) if count > 1 else plot_w / 2)

    def y(v: float) -> float:
        return PAD_TOP + plot_h - plot_h * min(v, top) / top

    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
             f"<title>{escape(title)}</title>"]
    for fraction in (0.0, 0.5, 1.0):
        gy = y(top * fraction)
        parts.append(f'<line class="grid" x1="{PAD_LEFT}" y1="{gy:.1f}" x2="{width - PAD_RIGHT}" y2="{gy:.1f}"/>')
        parts.append(f'<text class="axis" x="{PAD_LEFT - 6}" y="{gy + 4:.1f}" text-anchor="end">'
                     f"{escape(y_format(top * fraction))}</text>")
    parts.append(f'<text class="axis" x="{PAD_LEFT}" y="{height - 4}">{escape(x_left)}</text>')
    parts.append(f'<text class="axis" x="{width - PAD_RIGHT}" y="{height - 4}" text-anchor="end">'
                 f"{escape(x_right)}</text>")
    for label, values, css in series:
        for run in _segments(values):
            points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in run)
            if area and len(run) > 1:
                base = y(0)
                outline = f"{x(run[0][0]):.1f},{base:.1f} {points} {x(run[-1][0]):.1f},{base:.1f}"
                parts.append(f'<polygon class="area {escape(css)}" points="{outline}"/>')
            if len(run) == 1:
                i, v = run[0]
                parts.append(f'<circle class="dot {escape(css)}" cx="{x(i):.1f}" cy="{y(v):.1f}" r="2"/>')
            else:
                parts.append(f'<polyline class="line {escape(css)}" points="{points}">'
                             f"<title>{escape(label)}</title></polyline>")
    parts.append("</svg>")
    return Markup("".join(parts))


def sparkline(values: Sequence[float], *, width: int = 120, height: int = 22, css: str = "ok") -> Markup:
    """A tiny area chart without axes (the queue table's last hour)."""
    if not values:
        return Markup("")
    top = max(max(values), 1)
    step = width / max(len(values) - 1, 1)
    points = " ".join(f"{i * step:.1f},{height - 1 - (height - 2) * v / top:.1f}" for i, v in enumerate(values))
    outline = f"0,{height} {points} {width},{height}"
    return Markup(f'<svg class="spark" viewBox="0 0 {width} {height}" preserveAspectRatio="none" '
                  f'role="img" aria-label="jobs per minute, last hour">'
                  f'<polygon class="area {escape(css)}" points="{outline}"/>'
                  f'<polyline class="line {escape(css)}" points="{points}"/></svg>')
