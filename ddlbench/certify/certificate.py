"""A certificate: every figure of a run judged against its reference band, per node where pinned.

Verdicts (ReFrame's rule: the measured value, here the median, must lie within the band, ends included):

- `pass` / `fail`: the figure has a reference; `passed` true or false. `certain` says whether the whole
  95 % interval lies on the same side as the value (inside the band for a pass, outside for a fail),
  None without an interval: a pass that is not certain is within the measurement's noise of a bound;
- `no reference`: listed, `passed` null, and never counted as a pass;
- `not measured`: referenced, but its points failed: `passed` false.

The certificate passes when every referenced figure passes and at least one figure is referenced.
Nodes outside: the nodes with a per-node figure that fails.

A regression (ddlbench.certify.regressions) is judged apart: it does not change `passed`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ddlbench
from ddlbench.certify.references import Reference
from ddlbench.errors import ConfigError
from ddlbench.history.figures import Figure
from ddlbench.provenance import utc_now
from ddlbench.records import MEASUREMENT_VERSION

CERTIFICATE_VERSION = 1


def check_reference_names(
    references: dict[str, Reference], figures: list[Figure], *, unknown_prefixes: Iterable[str] = ()
) -> None:
    """A reference to a figure the suite does not produce is bad input: refused with the name and what
    the suite produces. `unknown_prefixes`: families whose names cannot be known (their part failed
    before naming them), whose references are then judged `not measured` instead."""
    produced = {figure.name for figure in figures}
    prefixes = tuple(unknown_prefixes)
    for name in references:
        if name in produced or (prefixes and name.startswith(prefixes)):
            continue
        shown = sorted(produced)
        more = f" … ({len(shown) - 12} more)" if len(shown) > 12 else ""
        raise ConfigError(
            f"references: {name}",
            f"the suite does not produce this figure; it produces: {', '.join(shown[:12])}{more}",
        )


def judge(figure: Figure, reference: Reference | None) -> dict[str, Any]:
    """One figure's certificate entry."""
    entry = figure.to_dict() | {
        "reference": None,
        "lower": None,
        "upper": None,
        "reference_form": None,
        "deviation": None,
        "passed": None,
        "certain": None,
        "status": "no reference",
    }
    if reference is None:
        return entry
    entry |= {
        "reference": reference.value,
        "lower": reference.low,
        "upper": reference.high,
        "reference_form": reference.form,
        "reference_unit": reference.unit,
    }
    if reference.unit != figure.unit:
        entry["unit_note"] = f"reference unit {reference.unit!r} differs from the figure's {figure.unit!r}"
    if figure.value is None:
        return entry | {"passed": False, "status": "not measured"}
    passed = bool(reference.holds(figure.value))
    entry |= {"passed": passed, "status": "pass" if passed else "fail", "deviation": reference.deviation(figure.value)}
    if figure.ci_low is not None and figure.ci_high is not None:
        ends = (reference.holds(figure.ci_low), reference.holds(figure.ci_high))
        entry["certain"] = bool(all(ends) if passed else not any(ends))
    return entry


def build_certificate(
    figures: list[Figure],
    references: dict[str, Reference] | None,
    *,
    system: str,
    partition: str,
    suite: str,
    config_hash: str,
    references_path: str | None,
    unmeasured: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The certificate as JSON-able data. `unmeasured`: referenced names the run could not produce
    (a part that failed before naming its figures), with why."""
    references = references or {}
    entries = [judge(figure, references.get(figure.name)) for figure in figures]
    for name, why in (unmeasured or {}).items():
        placeholder = Figure.unmeasured(name, unit=references[name].unit, kind="machine", why=why)
        entries.append(judge(placeholder, references[name]))
    referenced = [entry for entry in entries if entry["status"] != "no reference"]
    nodes_outside = sorted({entry["node"] for entry in referenced if entry["node"] and entry["passed"] is False})
    counts = {status: sum(entry["status"] == status for entry in entries) for status in _STATUSES}
    return {
        "certificate_version": CERTIFICATE_VERSION,
        "system": system,
        "partition": partition,
        "suite": suite,
        "config_hash": config_hash,
        "date": utc_now(),
        "ddlbench_version": ddlbench.__version__,
        "measurement_version": MEASUREMENT_VERSION,
        "references": references_path,
        "passed": bool(referenced) and all(entry["passed"] for entry in referenced),
        "counts": counts,
        "nodes": _nodes(entries),
        "nodes_outside": nodes_outside,
        "figures": entries,
        "regressions": [],
    }


_STATUSES = ("pass", "fail", "not measured", "no reference")


def _nodes(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per node: its figures' verdicts, and the names of those outside their band."""
    nodes: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if not entry["node"]:
            continue
        node = nodes.setdefault(entry["node"], {"node": entry["node"], "figures": 0, "referenced": 0, "outside": []})
        node["figures"] += 1
        node["referenced"] += entry["status"] != "no reference"
        if entry["passed"] is False:
            node["outside"].append(entry["name"])
    for node in nodes.values():
        node["passed"] = not node["outside"] if node["referenced"] else None
    return sorted(nodes.values(), key=lambda node: node["node"])
