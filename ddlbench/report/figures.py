"""A figure as the report writes it: the value, its 95 % interval and its n, with its flags beside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

# the repetitions a nonparametric 95 % interval of the median needs (ddlbench.statistics.median_ci)
MIN_CI_N = 6


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One table cell: text, the flags shown after it, a tooltip, and whether it reads as text."""

    text: str
    flags: tuple[str, ...] = ()
    title: str = ""
    is_text: bool = False
    href: str = ""  # the text links here (a file beside the report, e.g. a point's trace)


def missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)


def number(value: Any) -> str:
    """Four significant digits for floats, as they are for the rest; empty for a missing value. Large
    floats are written out ('12340', not '1.234e+04'), as the page's script writes them."""
    if missing(value):
        return ""
    if isinstance(value, float):
        text = f"{value:.4g}"
        return f"{float(text):.0f}" if "e+" in text and abs(value) < 1e15 else text
    return str(value)


def interval_text(median: Any, low: Any, high: Any, n: Any, *, unit: str) -> str:
    """'123.4 [118, 127.9] n=20 steps'; without an interval, why not: '97 n=3 repetitions (no 95 % CI: n < 6)'."""
    if missing(median):
        return ""
    singular = "launch" if unit == "launches" else unit.removesuffix("s")
    count = "" if missing(n) else f" n={int(n)} {singular if int(n) == 1 else unit}"
    if missing(low) or missing(high):
        return f"{number(median)}{count} (no 95 % CI: n < {MIN_CI_N})"
    return f"{number(median)} [{number(low)}, {number(high)}]{count}"


def point_notes(row: dict[str, Any]) -> tuple[str, ...]:
    """Flags of a measurement as such: another measurement version, cores shared beyond their count, a
    launch that ran beside other points on its host (seconds; the longest of a configuration's launches)."""
    notes = []
    if _true(row.get("other_measurement_version")):
        notes.append(f"measurement v{number(row.get('measurement_version') or row.get('measurement_versions'))}")
    if _true(row.get("oversubscribed")) or _true(row.get("any_oversubscribed")):
        notes.append("oversubscribed")
    shared = row.get("shared_host_s")
    if not missing(shared) and float(shared) > 0:  # disjoint cores, but a neighbour's memory traffic
        notes.append(f"beside other points {number(float(shared))} s")
    return tuple(notes)


def _true(value: Any) -> bool:
    return not missing(value) and bool(value)
