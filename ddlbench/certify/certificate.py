"""A certificate: every figure of a run judged against its reference band, per node where pinned.

Verdicts, four for a referenced figure (what an administrator accepting hardware keeps apart: NVIDIA's
cluster readiness engine tells "ran but too slow" from "crashed", and fails a missing measurement safe):

- `pass`: ran, and its value (the median) lies within the band, ends included (ReFrame's rule);
- `slow`: ran, and its value lies outside the band (`deviation` says by how much and which way);
- `failed`: the suite ran its points and they crashed, ran out of memory or time: no value, and
  `why_missing` gives the cause;
- `missing`: referenced, but the run produced no such figure at all (a node that did not run, a part the
  suite left out): it fails, as a measurement nobody made cannot vouch for the hardware;
- `no reference`: a figure without a reference: listed, `passed` null, never counted as a pass.

A check needs no reference (`Figure.check`: the silent-data-corruption replay, ddlbench.certify.replay): it
passes when its replays agree and is `failed` when one differs, its `finding` naming the rank, node and GPU;
with nothing to compare it is listed as `no reference`.

For a pass or a slow figure, `certain` says whether the whole 95 % interval lies on the same side as the
value (inside the band for a pass, outside for a slow one), None without an interval: a pass that is not
certain is within the measurement's noise of a bound.

The certificate passes when every referenced figure and every check passes and at least one figure is
judged against a reference band (checks alone vouch for no figure's value).
Nodes outside: the nodes with a per-node figure that does not pass. Version 2: `slow`, `failed` and
`missing` replace version 1's `fail` and `not measured`.

A regression (ddlbench.certify.regressions) is judged apart: it does not change `passed`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import ddlbench
from ddlbench.certify.cards import card_shares, find_card
from ddlbench.certify.references import Reference
from ddlbench.errors import ConfigError
from ddlbench.history.figures import Figure
from ddlbench.provenance import utc_now
from ddlbench.records import MEASUREMENT_VERSION

CERTIFICATE_VERSION = 2
VERDICTS = ("pass", "slow", "failed", "missing", "no reference")  # in the order reports list them
NOT_PASSING = ("slow", "failed", "missing")


def family(name: str) -> str:
    """A figure name's family: its first part (machine, throughput, scaling, …)."""
    return name.split("/", 1)[0]


def check_reference_names(
    references: dict[str, Reference], figures: list[Figure], *, unknown_prefixes: Iterable[str] = ()
) -> None:
    """A reference to a figure of a family the suite does not produce at all is bad input (a misspelt
    family, another suite's file): refused with the name and what the suite produces. A reference to a
    figure of a family it produces, but not this figure this time (a node that did not run), is judged
    `missing`. `unknown_prefixes`: families whose names cannot be known (their part failed before naming
    them), whose references are judged `failed` with the part's cause."""
    produced = {figure.name for figure in figures}
    families = {family(name) for name in produced}
    prefixes = tuple(unknown_prefixes)
    for name in references:
        if name in produced or family(name) in families or (prefixes and name.startswith(prefixes)):
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
    if figure.check:  # a check judges itself, whatever a reference says (the replay: its replays agree or not)
        passed = figure.check == "pass"
        return entry | {"passed": passed, "status": "pass" if passed else "failed"}
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
        return entry | {"passed": False, "status": "missing" if figure.never_ran else "failed"}
    passed = bool(reference.holds(figure.value))
    entry |= {"passed": passed, "status": "pass" if passed else "slow", "deviation": reference.deviation(figure.value)}
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
    device_name: str | None = None,
) -> dict[str, Any]:
    """The certificate as JSON-able data. `unmeasured`: referenced names the run could not produce
    (a part that failed before naming its figures), with why."""
    references = references or {}
    unmeasured = unmeasured or {}
    entries = [judge(figure, references.get(figure.name)) for figure in figures]
    for name, why in unmeasured.items():
        placeholder = Figure.unmeasured(name, unit=references[name].unit, kind="machine", why=why)
        entries.append(judge(placeholder, references[name]))
    produced = {figure.name for figure in figures} | set(unmeasured)
    for name in sorted(set(references) - produced):
        entries.append(judge(missing_figure(name, references[name]), references[name]))
    card = find_card(device_name)
    for entry in entries:  # the card's peak and achievable beside its measured figures (ddlbench.certify.cards)
        entry["card"] = card_shares(entry["name"], entry["value"], card)
    referenced = [entry for entry in entries if entry["status"] != "no reference"]
    nodes_outside = sorted({entry["node"] for entry in referenced if entry["node"] and entry["passed"] is False})
    counts = {status: sum(entry["status"] == status for entry in entries) for status in VERDICTS}
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
        "device": device_name,
        "card": card.name if card else None,
        # checks alone (a replay) vouch for no figure's value: a pass needs a figure judged against a band
        "passed": any(not entry["check"] for entry in referenced) and all(entry["passed"] for entry in referenced),
        "counts": counts,
        "nodes": _nodes(entries),
        "nodes_outside": nodes_outside,
        "figures": entries,
        "regressions": [],
    }


def missing_figure(name: str, reference: Reference) -> Figure:
    """The placeholder of a referenced figure no point of the run produced."""
    return Figure.unmeasured(
        name, unit=reference.unit, kind=family(name), why="no point of this run produced it", never_ran=True
    )


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
