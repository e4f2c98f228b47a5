"""Is this machine healthy? The certificate `ddlbench certify` leaves in the sweep's folder, summarised:
passed or failed, its figures counted by verdict, the failing ones with their reference bands, the nodes
outside their band, and regressions against the previous run.

certificate.json holds `passed`, `system`, `partition`, `date`, `figures` (each `name`, `unit`, `value`,
`ci_low`, `ci_high`, `n`, `reference`, `lower`, `upper`, `deviation`, `passed`, `status` one of pass,
fail, no reference, not measured, and `node`), `nodes_outside` and `regressions` (each `name`, `value`,
`previous_value`, `change`, `previous_run`). A certificate that cannot be read is said so, never fatal:
the report is about the sweep.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddlbench.report.figures import interval_text, missing, number

CERTIFICATE = "certificate.json"
# certificate version 2's verdicts (ddlbench.certify.certificate), then version 1's, for certificates kept from before
VERDICTS = ("pass", "slow", "fail", "failed", "not measured", "missing", "no reference")
NOT_PASSING = ("slow", "failed", "missing", "fail", "not measured")


def health_section(sweep_dir: Path) -> dict[str, Any]:
    """The health block's context: {'exists': False} without a certificate; 'error' when unreadable."""
    path = Path(sweep_dir) / CERTIFICATE
    if not path.exists():
        return {"exists": False, "path": str(path)}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return {"exists": True, "path": str(path), "error": ""} | _summarise(data)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return {"exists": True, "path": str(path), "error": f"cannot read {path.name}: {exc}"}


def _summarise(data: dict[str, Any]) -> dict[str, Any]:
    figures = [f for f in data.get("figures") or [] if isinstance(f, dict)]
    counts = {verdict: 0 for verdict in VERDICTS}
    for figure in figures:
        status = str(figure.get("status") or "no reference")
        counts[status] = counts.get(status, 0) + 1
    failing = [_figure_row(f) for f in figures if f.get("status") in NOT_PASSING]
    regressions = [
        {
            "name": _text(r.get("name")),
            "value": number(r.get("value")),
            "previous_value": number(r.get("previous_value")),
            "change": _percent(r.get("change")),
            "previous_run": _text(r.get("previous_run")),
        }
        for r in data.get("regressions") or []
        if isinstance(r, dict)
    ]
    return {
        "passed": data.get("passed") is True,
        "system": _text(data.get("system")),
        "partition": _text(data.get("partition")),
        "date": _text(data.get("date")),
        "counts": {verdict: n for verdict, n in counts.items() if n},
        "figures": len(figures),
        "failing": failing,
        "nodes_outside": [str(node) for node in data.get("nodes_outside") or []],
        "regressions": regressions,
    }


def _figure_row(figure: dict[str, Any]) -> dict[str, str]:
    unit = _text(figure.get("unit"))
    value = figure.get("value")
    if missing(value):
        why = _text(figure.get("why_missing"))
        status = _text(figure.get("status")) or "not measured"
        measured = f"{status}: {why}" if why else status
    else:
        n = figure.get("n")
        measured = f"{interval_text(value, figure.get('ci_low'), figure.get('ci_high'), n, unit='measurements')} {unit}"
    lower, upper, reference = figure.get("lower"), figure.get("upper"), figure.get("reference")
    band = f"{number(reference)} [{number(lower) or '−∞'}, {number(upper) or '∞'}]" if not missing(reference) else ""
    return {
        "figure_name": _text(figure.get("name")),
        "node": _text(figure.get("node")) or "all",
        "status": _text(figure.get("status")),
        "value": measured.strip(),
        "band": f"{band} {unit}".strip() if band else "",
        "deviation": _percent(figure.get("deviation")),
    }


def _percent(value: Any) -> str:
    return "" if missing(value) or isinstance(value, str) else f"{100 * float(value):+.1f} %"


def _text(value: Any) -> str:
    return "" if missing(value) else str(value)


def health_lines(health: dict[str, Any]) -> list[str]:
    """The block in sentences (for the Markdown summary and the page's first lines), unescaped."""
    if not health.get("exists"):
        return ["No machine certificate in this sweep's folder (ddlbench certify writes one there)."]
    if health.get("error"):
        return [health["error"]]
    verdict = "PASSED" if health["passed"] else "FAILED"
    counts = ", ".join(f"{n} {verdict_name}" for verdict_name, n in health["counts"].items()) or "no figures"
    where = " ".join(part for part in (health["system"], health["partition"]) if part)
    lines = [f"Machine certificate {verdict}{f' for {where}' if where else ''} ({health['date']}): {counts}."]
    if health["nodes_outside"]:
        lines.append(f"Nodes outside their band: {', '.join(health['nodes_outside'])}.")
    if health["regressions"]:
        lines.append(f"Regressions against the previous run: {len(health['regressions'])}.")
    return lines
