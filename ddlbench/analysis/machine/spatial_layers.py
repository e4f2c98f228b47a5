"""The machine file's `spatial_layers`: what spatial parallelism adds to a step per layer it runs on slabs,
from spatial_layers points.

A point trains a toy of `units` units (3×3 convolution, batch norm, ReLU) on slabs over all its ranks, with
the spatial strategy's own layers, and the same toy alone on each rank's slab, at four variants of channels
and map side (ddlbench.train.calibration.spatial_layer_kernel). Figures, in seconds:
- per variant and part (forward, backward), the median per step over every rank's timed steps pooled, on
  slabs and alone (95 % CI, n = ranks × steps);
- extra per unit = (on slabs − alone) ÷ units: one windowed layer's halo exchange, its window's copy (and
  backward its gradient slab and the halo's gradient returned), its slab batch norm beyond a plain one with
  the norm's two collectives, their autograd Functions and Python, the waits and clock-tick stalls as the
  ranks met them;
- the line extra = per_layer_s + per_byte_s · slab bytes (one rank's input slab of the unit, float32)
  fitted to the variants by least squares with both coefficients ≥ 0, its largest relative residual beside.
Torch-free: the machine file and its report are written on a login node.
"""

from __future__ import annotations

from typing import Any

from ddlbench.analysis.machine.fsdp_units import fit_nonnegative
from ddlbench.errors import DdlbenchError
from ddlbench.train.calibration.records import CalibrationRecord, stats_figure

PHASES = ("forward", "backward")
TERMS = ("per_layer_s", "per_byte_s")


def spatial_layer_figures(record: CalibrationRecord) -> dict[str, Any]:
    """The spatial_layers entry of an ok spatial_layers point."""
    ranks = sorted(record.ranks, key=lambda rank: rank.rank)
    point = record.point
    variants = []
    for index, first in enumerate(ranks[0].measurements):
        entries = [rank.measurements[index] for rank in ranks]
        if any(entry.get("kind") != "spatial_layers" for entry in entries):
            raise DdlbenchError(f"{record.point_id}: measurement {index} is not a spatial_layers entry")
        variant: dict[str, Any] = {
            key: first[key] for key in ("units", "channels", "side", "batch", "parts", "slab_bytes", "halo_bytes")
        }
        for side in ("alone", "slabs"):
            for part in ("forward_s", "backward_s"):
                variant[f"{side}_{part}"] = stats_figure([t for entry in entries for t in entry[side][part]])
        for phase in PHASES:
            extra = variant[f"slabs_{phase}_s"]["value"] - variant[f"alone_{phase}_s"]["value"]
            variant[f"{phase}_extra_per_layer_s"] = extra / variant["units"]
        variants.append(variant)
    if not variants:
        raise DdlbenchError(f"{record.point_id}: the spatial_layers point measured nothing")
    entry: dict[str, Any] = {
        "ranks": point.world_size,  # the ranks the toy's slabs were spread over
        "nodes": point.nodes,
        "layout": f"{point.nodes}x{point.ranks_per_node}",
        "threads": point.threads,
        "point_id": record.point_id,
    }
    rows = [(1.0, float(v["slab_bytes"])) for v in variants]
    for phase in PHASES:
        coefficients, rel_error_max = fit_nonnegative(rows, [v[f"{phase}_extra_per_layer_s"] for v in variants])
        entry[phase] = dict(zip(TERMS, coefficients, strict=True)) | {"rel_error_max": rel_error_max}
    entry["variants"] = variants
    return entry
