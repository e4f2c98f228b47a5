"""Reading a report the way its page does: the embedded tables decoded as templates/report.js decodes
them (ddlbench/report/tables.py writes them), and the HTML between two headings."""

from __future__ import annotations

import json
from typing import Any

START = '<script type="application/json" id="report-data">'


def embedded_json(html: str) -> str:
    """The JSON text of the page's data, as it stands in the page (escaped)."""
    start = html.index(START) + len(START)
    return html[start : html.index("</script>", start)]


def expand(encoded: Any, length: int) -> list[Any]:
    """A column as a plain list, from any of the spellings tables.py writes (report.js's expand)."""
    if isinstance(encoded, list):
        return encoded
    if "all" in encoded:
        return [encoded["all"]] * length
    if "at" in encoded:
        out: list[Any] = [encoded.get("mostly")] * length
        for row, value in zip(encoded["at"], expand(encoded["values"], len(encoded["at"])), strict=True):
            out[row] = value
        return out
    if "runs" in encoded:
        runs = encoded["runs"]
        out = []
        for code, count in zip(runs[::2], runs[1::2], strict=True):
            out += [None if code is None else encoded["values"][code]] * count
        return out
    if "codes" in encoded:
        return [None if code is None else encoded["values"][code] for code in encoded["codes"]]
    out, previous = [], ""
    for shared, rest in zip(encoded["shared"], encoded["rest"], strict=True):
        if shared < 0:
            out.append(None)
            continue
        previous = previous[:shared] + rest
        out.append(previous)
    return out


def tables(html: str) -> dict[str, dict[str, Any]]:
    """{table: {column key: values}}; a figure column is {"m", "lo", "hi", "n", "noisy", "unit"} of lists,
    and "_notes" holds each row's flags."""
    data = json.loads(embedded_json(html))
    out: dict[str, dict[str, Any]] = {}
    for name, table in data.items():
        length = table["length"]
        columns: dict[str, Any] = {}
        for column in table["columns"]:
            encoded = table["data"][column["key"]]
            if column["kind"] == "figure":
                columns[column["key"]] = {
                    part: (
                        encoded[part]
                        if part == "unit"
                        else expand(encoded[part], length)
                        if encoded[part] != []
                        else []
                    )
                    for part in ("m", "lo", "hi", "n", "noisy", "unit")
                }
            else:
                columns[column["key"]] = expand(encoded, length)
        if "_notes" in table["data"]:
            columns["_notes"] = expand(table["data"]["_notes"], length)
        columns["_titles"] = {c["key"]: c["title"] for c in table["columns"]}
        out[name] = columns
    return out


def rows(table: dict[str, Any], keys: list[str]) -> list[dict[str, Any]]:
    """The table's rows as dicts of the given plain (non-figure) columns."""
    length = len(next(iter(v for k, v in table.items() if not k.startswith("_") and isinstance(v, list))))
    return [{key: table[key][i] for key in keys} for i in range(length)]


def between(html: str, start: str, stop: str) -> str:
    """The page from `start` to the first `stop` after it."""
    first = html.index(start)
    return html[first : html.index(stop, first + len(start))]
