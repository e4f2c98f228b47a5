"""Line charts as small hand-written SVG: marks with 95 % error bars, guides (ideal scaling), linear or
logarithmic axes, a tooltip (SVG <title>) on every mark.

The report draws a few charts per model × dataset, and a sweep may have dozens of those: matplotlib
took 0.6 s and 90 kB for one such 2 × 2 figure, this takes milliseconds and a few kB per chart. Every
piece of text is XML-escaped here (names come from configs and records). Colours are set by the
caller; the legend is HTML beside the charts (one per group of charts that share lines).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 360, 250
LEFT, RIGHT, TOP, BOTTOM = 60, 12, 26, 42
# Tableau's ten colours: distinct, and readable on white
PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Mark:
    """One drawn value, its 95 % interval (None: none) and its tooltip; hollow when noisy."""

    x: float
    y: float
    low: float | None = None
    high: float | None = None
    hollow: bool = False
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Line:
    label: str
    colour: str
    marks: tuple[Mark, ...]
    dashed: bool = False  # a guide or an extrapolation: dotted
    dots: bool = True  # its marks drawn (a guide or a model's curve has none)
    width: float = 1.6  # 0: marks alone, not joined
    band: tuple[tuple[float, float, float], ...] = ()  # (x, low, high): an interval drawn as a shaded area


@dataclass(frozen=True, kw_only=True)
class Axis:
    label: str
    log: bool = False
    base: int = 10
    from_zero: bool = True  # linear axes start at 0 unless told otherwise
    ticks_at_values: bool = False  # ticks at the data's own x values (node counts), where few


@dataclass
class _Scale:
    low: float
    high: float
    log: bool
    start: float
    end: float
    ticks: list[float] = field(default_factory=list)

    def __call__(self, value: float) -> float:
        if self.log:
            value, low, high = math.log(value), math.log(self.low), math.log(self.high)
        else:
            low, high = self.low, self.high
        share = 0.5 if high == low else (value - low) / (high - low)
        return self.start + share * (self.end - self.start)


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def line_chart(lines: list[Line], *, title: str, x: Axis, y: Axis) -> str:
    """The chart as an <svg> element (its viewBox scales it to the width the page gives it)."""
    marks = [mark for line in lines for mark in line.marks if _drawable(mark, x, y)]
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
        f'<text class="chart-title" x="{WIDTH / 2:g}" y="15" text-anchor="middle">{escape(title)}</text>',
    ]
    if not marks:
        parts.append(f'<text x="{WIDTH / 2:g}" y="{HEIGHT / 2:g}" text-anchor="middle">no successful points</text>')
        return "".join([*parts, "</svg>"])
    xs = _scale([m.x for m in marks], x, LEFT, WIDTH - RIGHT)
    ys_values = [m.y for m in marks] + [v for m in marks for v in (m.low, m.high) if v is not None]
    ys_values += [v for line in lines for _, low, high in line.band for v in (low, high) if math.isfinite(v)]
    ys = _scale([v for v in ys_values if not y.log or v > 0], y, HEIGHT - BOTTOM, TOP)
    parts.append(_grid(xs, ys, x, y))
    for line in lines:
        if line.band:
            parts.append(_band(line, xs, ys))
    for line in lines:
        drawn = sorted((m for m in line.marks if _drawable(m, x, y)), key=lambda m: m.x)
        if not drawn:
            continue
        if line.width > 0:
            points = " ".join(f"{xs(m.x):.0f},{ys(m.y):.0f}" for m in drawn)
            dash = ' stroke-dasharray="2 3"' if line.dashed else ""
            parts.append(
                f'<polyline points="{points}" fill="none" stroke="{line.colour}" stroke-width="{line.width:g}"{dash}>'
                f"<title>{escape(line.label)}</title></polyline>"
            )
        if not line.dots:
            continue
        marks_svg = "".join(_mark(m, xs, ys) for m in drawn)
        parts.append(f'<g stroke="{line.colour}" fill="{line.colour}" stroke-width="1.4">{marks_svg}</g>')
    return "".join([*parts, "</svg>"])


def _band(line: Line, xs: _Scale, ys: _Scale) -> str:
    """The interval as a shaded polygon: its upper edge left to right, then its lower edge back."""
    kept = [(bx, low, high) for bx, low, high in sorted(line.band) if bx > 0 or not xs.log]
    if ys.log:  # an end at or below 0 is clipped to the axis
        kept = [(bx, max(low, ys.low), high) for bx, low, high in kept if high > 0]
    upper = [f"{xs(bx):.0f},{ys(high):.0f}" for bx, _, high in kept]
    lower = [f"{xs(bx):.0f},{ys(low):.0f}" for bx, low, _ in reversed(kept)]
    return f'<polygon points="{" ".join(upper + lower)}" fill="{line.colour}" fill-opacity="0.15" stroke="none"/>'


def _drawable(mark: Mark, x: Axis, y: Axis) -> bool:
    finite = all(math.isfinite(v) for v in (mark.x, mark.y))
    return finite and (not x.log or mark.x > 0) and (not y.log or mark.y > 0)


def _mark(m: Mark, xs: _Scale, ys: _Scale) -> str:
    """A mark and its error bar; stroke and fill come from the line's group."""
    cx, cy = xs(m.x), ys(m.y)
    bar = ""
    if m.low is not None and m.high is not None and math.isfinite(m.low) and math.isfinite(m.high):
        low = ys(max(m.low, ys.low)) if ys.log else ys(m.low)
        high = ys(m.high)
        path = f"M{cx:.0f} {low:.0f}V{high:.0f}M{cx - 3:.0f} {low:.0f}h6M{cx - 3:.0f} {high:.0f}h6"
        bar = f'<path d="{path}" stroke-width="1"/>'
    fill = ' fill="#fff"' if m.hollow else ""
    return f'{bar}<circle cx="{cx:.0f}" cy="{cy:.0f}" r="3.5"{fill}><title>{escape(m.note)}</title></circle>'


def _scale(values: list[float], axis: Axis, start: float, end: float) -> _Scale:
    low, high = min(values), max(values)
    if axis.log:
        base = axis.base
        low_exp, high_exp = math.log(low, base), math.log(high, base)
        pad = max(0.04 * (high_exp - low_exp), 0.08)
        scale = _Scale(base ** (low_exp - pad), base ** (high_exp + pad), True, start, end)
        scale.ticks = _log_ticks(scale.low, scale.high, base)
        return scale
    if axis.from_zero:
        low = min(low, 0.0)
    if axis.ticks_at_values and len(set(values)) <= 10:
        pad = 0.06 * (high - low or 1.0)
        scale = _Scale(low - pad, high + pad, False, start, end)
        scale.ticks = sorted(set(values))
        return scale
    step = _nice_step((high - low) / 5 or abs(high) or 1.0)
    scale = _Scale(math.floor(low / step) * step, math.ceil(high / step) * step, False, start, end)
    if scale.high == scale.low:
        scale.high += step
    count = round((scale.high - scale.low) / step)
    scale.ticks = [scale.low + i * step for i in range(count + 1)]
    return scale


def _nice_step(raw: float) -> float:
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def _log_ticks(low: float, high: float, base: int) -> list[float]:
    first, last = math.floor(math.log(low, base)), math.ceil(math.log(high, base))
    powers = [float(base) ** k for k in range(first, last + 1)]
    ticks = [t for t in powers if low <= t <= high]
    if base == 10 and len(ticks) < 3:  # within a decade or two: 1, 2, 5 × 10^k
        ticks = [p * f for p in powers for f in (1, 2, 5) if low <= p * f <= high]
    if len(ticks) > 9:
        ticks = ticks[:: math.ceil(len(ticks) / 9)]
    return ticks


def _tick_text(value: float) -> str:
    size = abs(value)
    if size >= 1e6:
        return f"{value / 1e6:.3g}M"
    if size >= 1e4:
        return f"{value / 1e3:.3g}k"
    if value == int(value):
        return str(int(value))
    return f"{value:.3g}"


def _grid(xs: _Scale, ys: _Scale, x: Axis, y: Axis) -> str:
    left, right, top, bottom = LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM
    lines = "".join(f"M{xs(t):.1f} {top}V{bottom}" for t in xs.ticks) + "".join(
        f"M{left} {ys(t):.1f}H{right}" for t in ys.ticks
    )
    out = [
        f'<path d="{lines}" stroke="#e5e5e5"/>',
        f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" stroke="#999"/>',
    ]
    out += [f'<text x="{xs(t):.0f}" y="{bottom + 14}" text-anchor="middle">{_tick_text(t)}</text>' for t in xs.ticks]
    out += [f'<text x="{left - 5}" y="{ys(t) + 4:.0f}" text-anchor="end">{_tick_text(t)}</text>' for t in ys.ticks]
    x_label = escape(x.label + (f" (log{x.base} scale)" if x.log else ""))
    y_label = escape(y.label + (" (log scale)" if y.log else ""))
    out.append(f'<text x="{(left + right) / 2:g}" y="{HEIGHT - 8}" text-anchor="middle">{x_label}</text>')
    out.append(
        f'<text transform="translate(13 {(top + bottom) / 2:g}) rotate(-90)" text-anchor="middle">{y_label}</text>'
    )
    return f'<g class="grid" font-size="10">{"".join(out)}</g>'
