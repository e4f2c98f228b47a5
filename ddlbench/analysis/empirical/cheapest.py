"""The cheapest configuration that meets a throughput or deadline target, from the throughput models.

For every series modelled over nodes (ddlbench.analysis.empirical.series) and every candidate node count
(the measured ones and those asked for), the model of samples/s R(n) with its 95 % prediction interval
gives the figure the target names:
- samples_per_s = R (samples/s);
- step_time_s = B(n) / R, B(n) the global batch at n nodes: Point's (ddlbench.point.global_batch_of),
  batch_size per replica × (n × ranks_per_node) // split, split = the world size for a model cut over
  every rank (s);
- epoch_time_s = E / R, E the samples of an epoch (s).
Its cost is node-hours per epoch, n·E/R/3600 (node-seconds per sample, n/R, when E is unknown). A
candidate that is no configuration (its ranks do not divide into the series' replicas, or the catalog
refuses it as a plan would) is listed as refused, with why. A candidate *meets* the target on its
central prediction, and meets it *surely* when the pessimistic end of its interval does too and that
interval rests on run-to-run variation: every measured configuration of the series had at least 2
launches (repetitions), each one value of the series. With one launch per configuration the interval
is the model's misfit across node counts, not how far a launch may fall: the answer says "one launch
per configuration: no run-to-run band" and claims nothing surely. The answer lists the candidates that
meet it, cheapest first, and names the cheapest sure one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ddlbench.analysis.empirical.modelling import predict, search
from ddlbench.analysis.empirical.series import Series, _dataset_samples
from ddlbench.analysis.keys import point_of_row, split_follows_world
from ddlbench.errors import DdlbenchError
from ddlbench.point import global_batch_of
from ddlbench.validity import why_skipped

TARGETS = {"samples_per_s": ">=", "step_time_s": "<=", "epoch_time_s": "<="}


@dataclass(frozen=True, kw_only=True)
class Target:
    figure: str
    bound: float

    def met(self, value: float) -> bool:
        return value >= self.bound if TARGETS[self.figure] == ">=" else value <= self.bound

    def __str__(self) -> str:
        return f"{self.figure} {TARGETS[self.figure]} {self.bound:g}"


def parse_target(text: str | None) -> Target:
    accepted = ", ".join(f"{name}{op}N" for name, op in TARGETS.items())
    if not text:
        raise DdlbenchError(f"--cheapest needs --target; accepted: {accepted}")
    match = re.fullmatch(r"\s*([a-z_]+)\s*(>=|<=)\s*([0-9.eE+-]+)\s*", text)
    if not match or match.group(1) not in TARGETS or TARGETS[match.group(1)] != match.group(2):
        raise DdlbenchError(f"--target {text!r} not understood; accepted: {accepted}")
    try:
        bound = float(match.group(3))
    except ValueError:
        raise DdlbenchError(f"--target {text!r}: {match.group(3)!r} is not a number") from None
    if not bound > 0:
        raise DdlbenchError(f"--target {text!r}: the bound must be positive")
    return Target(figure=match.group(1), bound=bound)


def cheapest(
    series: list[Series],
    target: Target,
    *,
    at: list[tuple[float, ...]] = (),
    method: str = "ddlbench",
    epoch_samples: int | None = None,
) -> dict[str, Any]:
    rates = [s for s in series if s.figure == "samples_per_s"]
    if not rates:
        raise DdlbenchError("--cheapest needs the samples_per_s figure modelled (add --figure samples_per_s)")
    if rates[0].parameters != ("nodes",):
        raise DdlbenchError("--cheapest models over nodes only (--over nodes): its cost is node-hours")
    choices, refused, bands = [], [], {}
    for s in rates:
        samples = epoch_samples or _dataset_samples(str(s.fixed.get("dataset")))
        if target.figure == "epoch_time_s" and samples is None:
            raise DdlbenchError(f"{s.label}: epoch_time_s needs the epoch's size: give --epoch-samples")
        bands[s.label] = run_to_run(s)
        fit = search(s.parameters, s.array(), s.lists(), method, "throughput")
        candidates = sorted({*s.x, *(tuple(p) for p in at)})
        for prediction in predict(fit, s.array(), candidates):
            batch = global_batch(s, prediction.x[0])
            if isinstance(batch, str):
                refused.append({"label": s.label, "x": prediction.x[0], "why": batch})
            else:
                choices.append(_choice(s, prediction, target, samples, batch, bands[s.label]))
    meeting = sorted((c for c in choices if c["meets"]), key=lambda c: c["cost"])
    sure = [c for c in meeting if c["sure"]]
    return {
        "target": str(target),
        "cost_unit": "node-h per epoch" if all(c["epoch_samples"] for c in choices) else "node-s per sample",
        "choices": meeting,
        "cheapest": meeting[0] if meeting else None,
        "cheapest_sure": sure[0] if sure else None,
        "band": _band_note(bands),
        "refused": refused,
        "why": ""
        if meeting
        else f"the best candidate reaches {_best(choices, target):.4g}"
        if choices
        else _none(refused),
    }


ONE_LAUNCH = "one launch per configuration: no run-to-run band"


def run_to_run(s: Series) -> str:
    """ "" when the series' band rests on run-to-run variation (every measured configuration launched at
    least twice); otherwise why it does not."""
    launches = [len(values) for values in s.values]
    if max(launches, default=0) < 2:
        return ONE_LAUNCH
    single = sum(1 for n in launches if n < 2)
    if single:
        return f"{single} of {len(launches)} configurations have one launch: no run-to-run band there"
    return ""


def global_batch(s: Series, nodes: float) -> int | str:
    """The series' global batch at `nodes` (Point.global_batch_size), or why there is no such
    configuration. The split is the series' own, or the world size where it follows it. A series of a
    sweep holds every configuration field, so the candidate is a Point and the catalog judges it as the
    plan would (ddlbench.validity); a series made by hand gets Point's formula and the divisibility check."""
    if nodes != int(nodes) or nodes < 1:
        return f"{nodes:g} nodes is not a whole number of nodes"
    ranks_per_node = int(s.fixed.get("ranks_per_node") or 1)
    world = int(nodes) * ranks_per_node
    split = world if split_follows_world(str(s.fixed.get("strategy"))) else int(s.fixed.get("split") or 1)
    if world % split:
        return f"{world} ranks at {nodes:g} nodes do not divide into replicas of split={split}"
    try:
        point = point_of_row(s.fixed, nodes=int(nodes), split=split)
    except KeyError:
        return global_batch_of(batch_size=int(s.fixed.get("batch_size") or 0), world_size=world, split=split)
    return why_skipped(point) or point.global_batch_size


def _choice(s: Series, prediction, target: Target, samples: int | None, batch: int, band: str) -> dict[str, Any]:
    nodes = prediction.x[0]
    rate, low, high = prediction.value, prediction.low, prediction.high
    if target.figure == "samples_per_s":
        value, worst = rate, low
        bounds = (low, high)
    else:
        work = samples if target.figure == "epoch_time_s" else batch
        value = work / rate if rate > 0 else float("inf")
        worst = work / low if low and low > 0 else float("inf") if low is not None else None
        bounds = (work / high if high and high > 0 else None, worst)
    cost = nodes * (samples or 1) / rate / (3600 if samples else 1) if rate > 0 else float("inf")
    return {
        "label": s.label,
        "x": nodes,
        "figure": target.figure,
        "value": value,
        "low": bounds[0],
        "high": bounds[1],
        "samples_per_s": rate,
        "global_batch_size": batch,
        "epoch_samples": samples,
        "cost": cost,
        "cost_node_h_per_epoch": cost if samples else float("nan"),
        "beyond": prediction.extrapolation,
        "meets": bool(np.isfinite(value) and target.met(value)),
        # surely: the pessimistic end meets it too, and that end is how far a launch may fall
        "sure": not band and worst is not None and bool(np.isfinite(worst)) and target.met(worst),
        "band": band or "95 % prediction interval over launches",
    }


def _band_note(bands: dict[str, str]) -> str:
    """What the intervals rest on, for the answer as a whole."""
    if bands and all(note == ONE_LAUNCH for note in bands.values()):
        return ONE_LAUNCH
    lacking = [f"{label}: {note}" for label, note in bands.items() if note]
    return "; ".join(lacking)


def _none(refused: list[dict[str, Any]]) -> str:
    return "no candidate is a configuration: " + "; ".join(f"{r['label']} at {r['x']:g}: {r['why']}" for r in refused)


def _best(choices: list[dict[str, Any]], target: Target) -> float:
    values = [c["value"] for c in choices]
    return max(values) if TARGETS[target.figure] == ">=" else min(values)
