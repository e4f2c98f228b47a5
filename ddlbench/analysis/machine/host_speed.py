"""How fast the host was while a point ran, against how fast it was while the calibration ran, and the machine
file as that host would have measured it. Torch-free.

Every training point and every calibration point times the same three fixed kernels (ddlbench.train.host_probe,
where each is defined): a convolution's forward and backward (compute_s), a 16 MiB copy (copy_s) and a
one-element all-reduce over the job (all_reduce_s). A point's probe (`point_probe`, kept in
Metrics.host_probe) pools its ranks' start and end probes by the median; the machine file's `host_probes`
keeps each calibration point's, per turn (rank 0 alone, or all its ranks at once).

    ratio of a figure = the point's median ÷ the calibration's median,
                        both with as many ranks probing at once on a host (at_once) and the same threads

(dimensionless; above 1: the host was slower during the point). Three ratios:
- compute: compute_s's, for every compute figure of the machine file (operator and layer timings, FLOP rates,
  FSDP2's per-unit and per-tensor costs);
- memory: copy_s's, for memory bandwidth, first touch, the optimizer step per parameter, collectives' and
  links' per-byte cost (ranks on one host exchange through its memory) and FSDP2's per-byte cost;
- latency: all_reduce_s's, for collectives' and links' per-call cost α; only between probes of as many ranks in
  all (a one-rank point has none).
A section of the machine file is set against the probes of the calibration point that measured it (its
point_id), else those of every calibration point pooled. `rescaled` returns the machine file with each figure
multiplied (a time) or divided (a rate) by its ratio: what a prediction made with it says is the model's error
with the host's drift between the calibration and the point taken out. It is a diagnosis, not a prediction
made before the point ran: the ratios come from the point's own probe.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

FIGURES = ("compute_s", "copy_s", "all_reduce_s")
# a figure's keys that are seconds (scaled by a time ratio) in the machine file's measured figures
TIME_KEYS = ("value", "mean", "median", "p5", "p95", "min", "max", "ci_low", "ci_high")


class ProbedRank(Protocol):
    hostname: str
    host_probe: tuple[dict[str, Any], ...]


def _sharing(ranks: Iterable[ProbedRank]) -> dict[int, int]:
    """Per rank (its index in `ranks`), how many of the ranks ran on its host."""
    ranks = list(ranks)
    hosts = [rank.hostname for rank in ranks]
    return {index: hosts.count(host) for index, host in enumerate(hosts)}


def _pooled(probes: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The median of each figure over `probes` (None where none has it), and n = probes pooled."""
    return {name: _median_of(probes, name) for name in FIGURES} | {"n": len(probes)}


def point_probe(ranks: Iterable[ProbedRank]) -> dict[str, Any] | None:
    """A training point's probe (Metrics.host_probe): each figure's median over its ranks' start and end probes,
    `at_once` = the most ranks on one host (they all probed at once), `ranks` = the job's ranks, `threads`;
    None when no rank probed (records from before the probe)."""
    ranks = list(ranks)
    probes = [probe for rank in ranks for probe in rank.host_probe]
    if not probes:
        return None
    sharing = _sharing(ranks)
    return _pooled(probes) | {
        "at_once": max(sharing.values()),
        "ranks": len(ranks),
        "threads": max(int(p.get("threads", 1)) for p in probes),
    }


def calibration_probes(point_id: str, benchmark: str, ranks: Iterable[ProbedRank]) -> list[dict[str, Any]]:
    """A calibration point's entries of the machine file's `host_probes`: one per turn (rank 0 alone: at_once 1,
    ranks 1; all its ranks: at_once = the most on one host, ranks = all), each figure pooled by the median."""
    ranks = list(ranks)
    sharing = _sharing(ranks)
    out = []
    for turn in ("alone", "all"):
        probes = [probe for rank in ranks for probe in rank.host_probe if probe.get("turn") == turn]
        if not probes:
            continue
        all_ranks = turn == "all"
        out.append(
            {
                "point_id": point_id,
                "benchmark": benchmark,
                "at_once": max(sharing.values()) if all_ranks else 1,
                "ranks": len(ranks) if all_ranks else 1,
                "threads": max(int(p.get("threads", 1)) for p in probes),
            }
            | _pooled(probes)
        )
    return out


@dataclass(frozen=True, kw_only=True)
class HostSpeed:
    """The point's probe ÷ the calibration's (module docstring); None where a figure could not be compared."""

    compute: float | None
    memory: float | None
    latency: float | None
    reference: str  # which calibration probes: a point id, or "pooled"

    def factor(self, name: str) -> float:
        value = getattr(self, name)
        return 1.0 if value is None else value


def _ratio(now: Any, then: Any) -> float | None:
    if now is None or then is None or float(then) <= 0:
        return None
    return float(now) / float(then)


def host_speed(
    probe: Mapping[str, Any], references: list[Mapping[str, Any]], *, point_id: str | None = None
) -> HostSpeed:
    """`probe` (a point's) against the calibration probes of `point_id` (else all of them pooled), at the
    point's threads and `at_once`; latency only against probes of as many ranks."""
    threads = int(probe.get("threads", 1))
    at_once = int(probe.get("at_once", 1))
    usable = [r for r in references if int(r.get("threads", 1)) == threads]
    own = [r for r in usable if point_id is not None and r.get("point_id") == point_id]
    chosen, name = (own, str(point_id)) if any(int(r["at_once"]) == at_once for r in own) else (usable, "pooled")
    same = [r for r in chosen if int(r["at_once"]) == at_once]
    if not same:
        return HostSpeed(compute=None, memory=None, latency=None, reference="none")
    ranks = int(probe.get("ranks", 1))
    latency = [r for r in chosen if int(r["ranks"]) == ranks]
    return HostSpeed(
        compute=_ratio(probe.get("compute_s"), _median_of(same, "compute_s")),
        memory=_ratio(probe.get("copy_s"), _median_of(same, "copy_s")),
        latency=_ratio(probe.get("all_reduce_s"), _median_of(latency, "all_reduce_s")),
        reference=name,
    )


def _median_of(probes: list[Mapping[str, Any]], name: str) -> float | None:
    values = [float(p[name]) for p in probes if p.get(name) is not None]
    return statistics.median(values) if values else None


def _times(figure: Any, factor: float) -> Any:
    """A measured figure (a mapping with `value`…, and the figures nested in it: the autograd engine's chains)
    or a number, its seconds multiplied by `factor`."""
    if isinstance(figure, Mapping):
        return {
            key: _times(value, factor)
            if isinstance(value, Mapping)
            else (value * factor if key in TIME_KEYS and isinstance(value, (int, float)) else value)
            for key, value in figure.items()
        }
    if isinstance(figure, (int, float)) and not isinstance(figure, bool):
        return figure * factor
    return figure


def _fit_times(node: Any, factor: float) -> Any:
    """A fitted line's seconds (alpha_s, beta_s_per_sample) multiplied by `factor`."""
    if not isinstance(node, Mapping):
        return node
    return {
        key: (value * factor if key in ("alpha_s", "beta_s_per_sample") and value is not None else value)
        for key, value in node.items()
    }


def rescaled(machine: Mapping[str, Any], probe: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, HostSpeed]]:
    """The machine file as the host of `probe` (a point's) would have measured it (module docstring), and the
    speed each section was set against (by section: compute, links, and each entry's point id)."""
    out = copy.deepcopy(dict(machine))
    references = list(machine.get("host_probes") or ())
    speeds: dict[str, HostSpeed] = {}

    def speed_of(point_id: str | None, section: str) -> HostSpeed:
        key = f"{section} {point_id}" if point_id else section
        if key not in speeds:
            speeds[key] = host_speed(probe, references, point_id=point_id)
        return speeds[key]

    compute = out.get("compute") or {}
    compute_points = sorted({r["point_id"] for r in references if r.get("benchmark") == "compute"})
    s = speed_of(compute_points[0] if len(compute_points) == 1 else None, "compute")
    for key in ("matmul_flop_per_s", "conv_flop_per_s"):
        for precision, figure in (compute.get(key) or {}).items():
            if isinstance(figure, Mapping) and figure.get("value"):
                compute[key][precision] = {**figure, "value": float(figure["value"]) / s.factor("compute")}
    bandwidth = compute.get("memory_bandwidth_bytes_per_s")
    if isinstance(bandwidth, Mapping) and bandwidth.get("value"):
        compute["memory_bandwidth_bytes_per_s"] = {**bandwidth, "value": float(bandwidth["value"]) / s.factor("memory")}
    for key in ("first_touch_s_per_byte", "update_s_per_param"):  # seconds of passes over memory
        if compute.get(key) is not None:
            compute[key] = _times(compute[key], s.factor("memory"))

    for entry in out.get("collectives") or ():
        s = speed_of(entry.get("point_id"), "collectives")
        _scale_alpha_beta(entry, s)
        if isinstance(entry.get("busy"), dict):
            _scale_alpha_beta(entry["busy"], s)
    s = speed_of(None, "links")
    for link in (out.get("links") or {}).values():
        if isinstance(link, dict):
            _scale_alpha_beta(link, s)

    for entry in out.get("operator_timings") or ():
        r = speed_of(entry.get("point_id"), "operators").factor("compute")
        entry["samples"] = [
            {**sample, "forward_s": sample["forward_s"] * r, "backward_s": sample["backward_s"] * r}
            for sample in entry.get("samples") or ()
        ]
        if entry.get("autograd_call_s") is not None:
            entry["autograd_call_s"] = _times(entry["autograd_call_s"], r)
    for entry in out.get("layer_timings") or ():
        r = speed_of(entry.get("point_id"), "layer_timings").factor("compute")
        for block in entry.get("blocks") or ():
            for phase in ("forward", "backward"):
                block[f"{phase}_s"] = [_times(figure, r) for figure in block.get(f"{phase}_s") or ()]
                block[f"{phase}_fit"] = _fit_times(block.get(f"{phase}_fit"), r)
        for key in ("loss_s", "step_s", "other_s"):
            if isinstance(entry.get(key), list):
                entry[key] = [_times(figure, r) for figure in entry[key]]
        entry["loss_fit"] = _fit_times(entry.get("loss_fit"), r)
        if entry.get("update_s") is not None:
            entry["update_s"] = _times(entry["update_s"], r)
    for entry in out.get("fsdp_units") or ():
        s = speed_of(entry.get("point_id"), "fsdp_units")
        for phase in ("forward", "backward", "update"):
            node = entry.get(phase)
            if isinstance(node, dict):
                for key in ("per_unit_s", "per_tensor_s"):
                    if node.get(key) is not None:
                        node[key] = float(node[key]) * s.factor("compute")
                if node.get("per_byte_s") is not None:
                    node["per_byte_s"] = float(node["per_byte_s"]) * s.factor("memory")
    for entry in out.get("spatial_layers") or ():
        s = speed_of(entry.get("point_id"), "spatial_layers")
        for phase in ("forward", "backward"):
            node = entry.get(phase)
            if isinstance(node, dict):
                if node.get("per_layer_s") is not None:
                    node["per_layer_s"] = float(node["per_layer_s"]) * s.factor("compute")
                if node.get("per_byte_s") is not None:
                    node["per_byte_s"] = float(node["per_byte_s"]) * s.factor("memory")
    return out, speeds


def _scale_alpha_beta(node: dict[str, Any], s: HostSpeed) -> None:
    """A collective's or link's α × the latency ratio, β × the memory ratio, its bandwidth ÷ it."""
    if node.get("alpha_s") is not None:
        node["alpha_s"] = float(node["alpha_s"]) * s.factor("latency")
    if node.get("beta_s_per_byte") is not None:
        node["beta_s_per_byte"] = float(node["beta_s_per_byte"]) * s.factor("memory")
    if node.get("bandwidth_bytes_per_s"):
        node["bandwidth_bytes_per_s"] = float(node["bandwidth_bytes_per_s"]) / s.factor("memory")
