"""The machine file's `fsdp_units`: what FSDP2 adds to a step per unit it shards, from fsdp_units points.

A point trains a toy of `units` units sharded with FSDP2 and the same toy unsharded, at four variants of
tensors and bytes per unit (ddlbench.train.calibration.fsdp_unit_kernel), sharded over all its ranks and
over one rank (each its own). One entry per mesh size (`ranks`). Figures, in seconds:
- per variant and part (forward, backward, update), the median per step over every rank's timed steps
  pooled, sharded and unsharded (95 % CI, n = ranks × steps);
- forward and backward: extra per unit = (sharded − unsharded) ÷ units, and the line
  extra = per_unit_s + per_tensor_s · tensors + per_byte_s · bytes (the unit's unsharded parameters)
  fitted to the four variants by least squares with every coefficient ≥ 0, its largest relative
  residual beside it;
- update: extra per tensor = (sharded − unsharded ÷ mesh ranks) ÷ tensors, the median over variants: the
  optimizer's DTensor dispatch per parameter, beyond the 1/p of the update's arithmetic a shard keeps.
Torch-free: the machine file and its report are written on a login node.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from ddlbench.errors import DdlbenchError
from ddlbench.train.calibration.records import CalibrationRecord, stats_figure

PHASES = ("forward", "backward")
TERMS = ("per_unit_s", "per_tensor_s", "per_byte_s")


def fit_nonnegative(rows: list[tuple[float, ...]], targets: list[float]) -> tuple[list[float], float | None]:
    """Least squares of targets on rows' columns with every coefficient ≥ 0 (the best of the subsets of
    columns whose unconstrained solution is nonnegative: 2^k small solves for k ≤ 3 columns); the
    coefficients and the largest |residual| ÷ target."""
    import numpy as np  # pandas' dependency; imported here so the module stays light to import

    a, y = np.asarray(rows, dtype=float), np.asarray(targets, dtype=float)
    columns = a.shape[1]
    best, best_error = [0.0] * columns, float(np.sum(y**2))
    for size in range(1, columns + 1):
        for subset in itertools.combinations(range(columns), size):
            solution, *_ = np.linalg.lstsq(a[:, subset], y, rcond=None)
            if (solution < 0).any():
                continue
            coefficients = [0.0] * columns
            for index, value in zip(subset, solution, strict=True):
                coefficients[index] = float(value)
            error = float(np.sum((a @ np.asarray(coefficients) - y) ** 2))
            if error < best_error:
                best, best_error = coefficients, error
    predicted = np.asarray(rows, dtype=float) @ np.asarray(best)
    relative = [float(abs(p - t) / t) for p, t in zip(predicted, targets, strict=True) if t > 0]
    return best, (max(relative) if relative else None)


def fsdp_unit_figures(record: CalibrationRecord) -> list[dict[str, Any]]:
    """The fsdp_units entries of an ok fsdp_units point: one per mesh the toy was sharded over (the point's
    ranks, and one rank: each rank its own)."""
    ranks = sorted(record.ranks, key=lambda rank: rank.rank)
    point = record.point
    by_mesh: dict[int, list[dict[str, Any]]] = {}
    for index, first in enumerate(ranks[0].measurements):
        entries = [rank.measurements[index] for rank in ranks]
        if any(entry.get("kind") != "fsdp_units" for entry in entries):
            raise DdlbenchError(f"{record.point_id}: measurement {index} is not an fsdp_units entry")
        mesh = int(first.get("mesh_ranks", point.world_size))
        variant: dict[str, Any] = {
            key: first[key] for key in ("units", "layers_per_unit", "width", "tensors_per_unit", "unit_bytes")
        }
        for side in ("plain", "fsdp"):
            for part in ("forward_s", "backward_s", "update_s"):
                variant[f"{side}_{part}"] = stats_figure([t for entry in entries for t in entry[side][part]])
        units, tensors = variant["units"], variant["units"] * variant["tensors_per_unit"]
        for phase in PHASES:
            extra = variant[f"fsdp_{phase}_s"]["value"] - variant[f"plain_{phase}_s"]["value"]
            variant[f"{phase}_extra_per_unit_s"] = extra / units
        update = variant["fsdp_update_s"]["value"] - variant["plain_update_s"]["value"] / mesh
        variant["update_extra_per_tensor_s"] = update / tensors
        by_mesh.setdefault(mesh, []).append(variant)
    if not by_mesh:
        raise DdlbenchError(f"{record.point_id}: the fsdp_units point measured nothing")
    return [_entry(record, mesh, variants) for mesh, variants in by_mesh.items()]


def _entry(record: CalibrationRecord, mesh: int, variants: list[dict[str, Any]]) -> dict[str, Any]:
    point = record.point
    rows = [(1.0, float(v["tensors_per_unit"]), float(v["unit_bytes"])) for v in variants]
    entry: dict[str, Any] = {
        "ranks": mesh,  # the ranks each unit was sharded over
        "nodes": point.nodes if mesh == point.world_size else 1,
        "layout": f"{point.nodes}x{point.ranks_per_node}",  # the ranks that ran at once
        "threads": point.threads,
        "point_id": record.point_id,
    }
    for phase in PHASES:
        targets = [v[f"{phase}_extra_per_unit_s"] for v in variants]
        coefficients, rel_error_max = fit_nonnegative(rows, targets)
        entry[phase] = dict(zip(TERMS, coefficients, strict=True)) | {"rel_error_max": rel_error_max}
    entry["update"] = {"per_tensor_s": max(0.0, statistics.median(v["update_extra_per_tensor_s"] for v in variants))}
    entry["variants"] = variants
    return entry
