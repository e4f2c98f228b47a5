"""The report's large tables as data: encoded once as compact JSON inside the page, drawn by its script.

A 10,000-point sweep's points and configurations written as HTML rows made the page 24 MB; as columns
of JSON they are a fraction of that, and the page's script draws only the rows on screen (sortable by
the figures' values, paginated, filtered). Each section shows a view: a slice of a table's rows and a
subset of its columns (`view`).

Encoding, per column (the script decodes it, templates/report.js):

- text: a list, or {"values", "codes"} when values repeat (dictionary; {"values", "runs"}, with runs
  of codes as code, count, code, count…, when they come in long runs), {"shared", "rest"} when
  consecutive values share their beginnings (front coding: point ids), {"at", "values"} when most are
  missing (sparse: the rows that have one);
- number: a list of numbers rounded to 4 significant digits (what the report shows), null where missing,
  or a dictionary as for text when a few values repeat;
- figure: {"m", "lo", "hi", "n", "noisy", "unit"}: a median with its 95 % interval, its sample size and
  what it counts; noisy as 0/1;
- any of these lists, when every row holds the same value: {"all": value}; when most do,
  {"mostly": value, "at": [rows], "values": [theirs]}.
- link: text, a path relative to the report (a point's trace).

The JSON is escaped for a <script> element: "<", ">" and "&" as \\u003c, \\u003e, \\u0026, so no string
from a record can close the element; the script only ever sets text (textContent), never markup.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ddlbench.report.columns import column
from ddlbench.report.figures import missing

KINDS = ("text", "number", "figure", "link")


@dataclass(frozen=True, kw_only=True)
class Spec:
    """One column of a data table: its key (ddlbench.report.columns), how it is drawn, where its values come
    from (`source`: a column, or a figure's prefix for <prefix>_median/_ci_low/_ci_high/_noisy), the column
    of its n, the unit its n counts, a factor to apply (seconds → ms: 1000), and whether the row's notes
    (oversubscribed, another measurement version) follow it as flags."""

    key: str
    kind: str = "number"
    source: str = ""
    n_column: str = ""
    n_unit: str = "steps"
    factor: float = 1.0
    notes: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown column kind {self.kind!r}; known: {', '.join(KINDS)}")


def encode_table(frame: pd.DataFrame, specs: list[Spec], *, notes: list[str] | None = None) -> dict[str, Any]:
    """The table as the page's script reads it; `notes`: each row's flags, ';'-separated ('' for none)."""
    data: dict[str, Any] = {}
    columns = []
    for spec in specs:
        source = spec.source or spec.key
        if spec.kind == "figure":
            encoded = _figure(frame, source, spec)
        elif spec.kind in ("text", "link"):
            encoded = encode_text([_text(v) for v in _values(frame, source)])
        else:
            encoded = packed([rounded(v, spec.factor) for v in _values(frame, source)])
        data[spec.key] = encoded
        described = column(spec.key)
        columns.append({"key": spec.key, "title": described.title, "about": described.description, "kind": spec.kind})
        if spec.notes:
            columns[-1]["notes"] = 1
    if notes is not None:
        data["_notes"] = encode_text(notes)
    return {"columns": columns, "length": len(frame), "data": data}


def _values(frame: pd.DataFrame, name: str) -> list[Any]:
    if name not in frame.columns:
        return [None] * len(frame)
    return frame[name].tolist()


def _text(value: Any) -> str | None:
    return None if missing(value) else str(value)


def _figure(frame: pd.DataFrame, prefix: str, spec: Spec) -> dict[str, Any]:
    noisy = [0 if missing(v) else int(bool(v)) for v in _values(frame, f"{prefix}_noisy")]
    return {
        "m": packed([rounded(v, spec.factor) for v in _values(frame, f"{prefix}_median")]),
        "lo": packed([rounded(v, spec.factor) for v in _values(frame, f"{prefix}_ci_low")]),
        "hi": packed([rounded(v, spec.factor) for v in _values(frame, f"{prefix}_ci_high")]),
        "n": packed([rounded(v) for v in _values(frame, spec.n_column)]) if spec.n_column else [],
        "noisy": packed(noisy),
        "unit": spec.n_unit,
    }


def packed(values: list[Any]) -> Any:
    """{"all": value} for a list of one repeated value; a dictionary when a few values repeat (node
    counts, batch sizes); the list otherwise."""
    if len(values) > 1 and all(value == values[0] for value in values):
        return {"all": values[0]}
    common, count = Counter(values).most_common(1)[0] if values else (None, 0)
    if len(values) > 20 and count >= 0.8 * len(values):  # a few exceptions to one value
        others = [i for i, value in enumerate(values) if value != common]
        return {"mostly": common, "at": others, "values": [values[i] for i in others]}
    distinct = set(values)
    if len(distinct) <= 10 and len(values) > 20 and None not in distinct:
        ordered = sorted(distinct)
        index = {value: i for i, value in enumerate(ordered)}
        coded = dictionary(ordered, [index[value] for value in values])
        if "runs" in coded or max(len(str(value)) for value in ordered) > 1:
            return coded
    return values


def dictionary(values: list[Any], codes: list[int | None]) -> dict[str, Any]:
    """{"values", "codes"}, or {"values", "runs"} (code, count, code, count…) where codes come in long runs
    (a sweep's outer axes: model, dataset, strategy, in the points' order)."""
    runs: list[int | None] = []
    for code in codes:
        if runs and runs[-2] == code:
            runs[-1] += 1  # type: ignore[operator]
        else:
            runs += [code, 1]
    if len(runs) < len(codes) // 2:
        return {"values": values, "runs": runs}
    return {"values": values, "codes": codes}


def rounded(value: Any, factor: float = 1.0) -> float | int | None:
    """4 significant digits (what the report prints), integers as integers; None where missing or infinite."""
    if missing(value) or isinstance(value, str):
        return None
    if isinstance(value, bool):
        return int(value)
    number = float(value) * factor
    if not math.isfinite(number):
        return None
    if number == int(number) and abs(number) < 1e15:
        return int(number)
    short = float(f"{number:.4g}")
    return int(short) if short == int(short) and abs(short) < 1e15 else short


def encode_text(values: list[str | None]) -> Any:
    """The smallest spelling of a text column (see the module's docstring)."""
    distinct = {value for value in values if value is not None}
    present = [i for i, value in enumerate(values) if value is not None]
    if len(values) > 1 and len(distinct) == 1 and len(present) == len(values):
        return {"all": values[0]}
    if len(present) < len(values) // 2:
        return {"at": present, "values": encode_text([values[i] for i in present])}
    if len(distinct) <= max(1, len(values) // 2):
        ordered = sorted(distinct)
        index = {value: i for i, value in enumerate(ordered)}
        return dictionary(ordered, [None if v is None else index[v] for v in values])
    shared, rest, previous = [], [], ""
    for value in values:
        if value is None:
            shared.append(-1)
            rest.append("")
            continue
        common = 0
        for a, b in zip(previous, value, strict=False):
            if a != b:
                break
            common += 1
        shared.append(common)
        rest.append(value[common:])
        previous = value
    if sum(len(r) for r in rest) + 3 * len(rest) < sum(len(v or "") for v in values):
        return {"shared": shared, "rest": rest}
    return values


def script_json(data: Any) -> str:
    """JSON that is safe inside <script type="application/json">: no '<', '>' or '&' left to close it."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def view(table: str, keys: list[str], *, start: int = 0, stop: int | None = None, page: int = 25) -> dict[str, Any]:
    """What a section shows of a table: rows [start, stop), these columns, `page` rows at a time."""
    return {"table": table, "columns": " ".join(keys), "start": start, "stop": stop, "page": page}
