"""A reference file proposed from a run, for an administrator to review before it certifies anything.

Per figure of the partition (per-node figures are judged against their partition figure's reference and
get none of their own): the reference value is the run's value (a median), and the tolerances are the
run's 95 % interval as fractions of it, widened to at least ±`min_tolerance` (default MIN_TOLERANCE): an
interval of the median within one run narrows as samples grow and knows nothing of the variation from
run to run (±35 % seen between runs on 2 shared CPU cores; a few % on dedicated GPU nodes), so set the
floor from repeated runs of a healthy partition. A figure without an interval gets at least
±NO_INTERVAL_TOLERANCE. Unmeasured figures are left out.
"""

from __future__ import annotations

from typing import Any

import yaml

from ddlbench.certify.references import REFERENCES_VERSION
from ddlbench.history.figures import CHECK_KINDS, Figure

MIN_TOLERANCE = 0.10
NO_INTERVAL_TOLERANCE = 0.20


def propose_references(
    figures: list[Figure], *, system: str, partition: str, min_tolerance: float = MIN_TOLERANCE
) -> dict[str, Any]:
    proposed: dict[str, Any] = {}
    for figure in figures:
        if figure.node or figure.value is None or figure.value == 0 or figure.kind in CHECK_KINDS:
            continue  # a check judges itself (a replay, health, a spread): no band to propose
        value = figure.value
        if figure.ci_low is None or figure.ci_high is None:
            lower, upper = -max(min_tolerance, NO_INTERVAL_TOLERANCE), max(min_tolerance, NO_INTERVAL_TOLERANCE)
        else:
            lower = min(-min_tolerance, (figure.ci_low - value) / abs(value))
            upper = max(min_tolerance, (figure.ci_high - value) / abs(value))
        proposed[figure.name] = {
            "value": _round(value),
            "lower": round(max(lower, -1.0), 4),
            "upper": round(upper, 4),
            "unit": figure.unit,
        }
    return {"references_version": REFERENCES_VERSION, "systems": {f"{system}:{partition}": proposed}}


def references_text(proposal: dict[str, Any], *, source: str, min_tolerance: float = MIN_TOLERANCE) -> str:
    header = (
        f"# Reference figures proposed by `ddlbench certify --write-references` from {source}.\n"
        "# value: the run's median; lower/upper: its 95 % interval as fractions of the value, at least\n"
        f"# ±{min_tolerance:g} (±{max(min_tolerance, NO_INTERVAL_TOLERANCE):g} where the run had no interval).\n"
        "# One run's intervals know nothing of run-to-run variation: review before use.\n"
    )
    return header + yaml.safe_dump(proposal, sort_keys=False, width=200)


def _round(value: float) -> float:
    return float(f"{value:.6g}")
