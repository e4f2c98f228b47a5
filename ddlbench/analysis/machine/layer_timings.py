"""The machine file's `layer_timings`: per-block forward and backward times of models, from layer-timing points.

ParaDL (Kahira et al., HPDC'21) predicts a step from profiled per-layer times rather than FLOPs ÷ a
peak rate, since a layer's efficiency depends on its shape; a layer-timing point gives those times on this
machine (ddlbench.train.calibration.layer_timing_kernel says what each time spans). Figures, in seconds per step:
- per batch size, a part's figure is the median over the timed steps of every rank pooled (the ranks
  ran at once on one node, each its own copy of the model), with its 95 % CI and n = ranks × steps;
- a fit per block (forward, backward) and of the loss: time = α + β·batch over the batch sizes' medians,
  fitted as ddlbench.analysis.machine.fit fits collectives (relative residuals, α, β ≥ 0), β per sample;
- update_s (zero_grad + optimizer step) does not depend on the batch: one figure over all sizes;
- other_s, per batch size: the step's time no part accounts for (gaps between hooks, autocast).
Torch-free: the machine file and its report are written on a login node.
"""

from __future__ import annotations

from typing import Any

from ddlbench.analysis.machine.fit import fit_alpha_beta
from ddlbench.errors import DdlbenchError
from ddlbench.train.calibration.records import CalibrationRecord, stats_figure

PER_BATCH = ("loss_s", "step_s", "other_s")  # per-batch-size parts besides the blocks'
REQUIRED = ("model", "dataset", "options", "precision", "threads", "ranks_per_node", "batch_sizes", "blocks")
REQUIRED_PER_BATCH = ("loss_s", "step_s")
BLOCK_PARTS = ("forward_s", "backward_s")


def fit_line(batch_sizes: list[int], figures: list[dict[str, Any]]) -> dict[str, float]:
    """time = alpha_s + beta_s_per_sample · batch over the figures' medians (a constant when one is not > 0)."""
    times = [figure["value"] for figure in figures]
    if min(times) <= 0:
        return {"alpha_s": max(0.0, sum(times) / len(times)), "beta_s_per_sample": 0.0, "rel_error_max": None}
    fit = fit_alpha_beta([float(batch) for batch in batch_sizes], times)
    return {"alpha_s": fit.alpha_s, "beta_s_per_sample": fit.beta_s_per_byte, "rel_error_max": fit.rel_error_max}


def layer_timing_figures(record: CalibrationRecord) -> dict[str, Any] | str:
    """The layer_timings entry of an ok layer-timing point; or why the rank timed nothing (a refused precision)."""
    ranks = sorted(record.ranks, key=lambda rank: rank.rank)
    refused = next((entry["error"] for entry in ranks[0].measurements if "error" in entry), None)
    if refused:
        return refused
    point = record.point
    by_batch = [[rank.measurements[index] for rank in ranks] for index in range(len(ranks[0].measurements))]
    batch_sizes = [entries[0]["batch_size"] for entries in by_batch]

    def pooled(part: str, block: int | None = None) -> list[dict[str, Any]]:
        figures = []
        for entries in by_batch:
            sources = [entry["blocks"][block] if block is not None else entry for entry in entries]
            figures.append(stats_figure([t for source in sources for t in source[part]]))
        return figures

    blocks = []
    for index, block in enumerate(by_batch[0][0]["blocks"]):
        forward, backward = pooled("forward_s", index), pooled("backward_s", index)
        blocks.append(
            {
                "name": block["name"],
                "forward_s": forward,
                "backward_s": backward,
                "forward_fit": fit_line(batch_sizes, forward),
                "backward_fit": fit_line(batch_sizes, backward),
            }
        )
    loss = pooled("loss_s")
    return {
        "model": point.model,
        "dataset": point.dataset,
        "options": dict(point.model_options),
        "precision": point.precisions[0],
        "threads": ranks[0].threads,
        "ranks_per_node": len(ranks),
        "batch_sizes": batch_sizes,
        "point_id": record.point_id,
        "blocks": blocks,
        "loss_s": loss,
        "loss_fit": fit_line(batch_sizes, loss),
        "update_s": stats_figure([t for entries in by_batch for entry in entries for t in entry["update_s"]]),
        "step_s": pooled("step_s"),
        "other_s": pooled("other_s"),
    }


def check_layer_timings(timings: Any, where: str) -> None:
    """Raise DdlbenchError naming the first malformed entry of a machine file's layer_timings (absent: None)."""
    if timings is None:
        return
    if not isinstance(timings, list):
        raise DdlbenchError(f"{where}: layer_timings is {type(timings).__name__}, not a list")
    for index, entry in enumerate(timings):
        at = f"{where}: layer_timings[{index}]"
        if not isinstance(entry, dict):
            raise DdlbenchError(f"{at} is {type(entry).__name__}, not a mapping")
        missing = [key for key in (*REQUIRED, *REQUIRED_PER_BATCH, "update_s", "loss_fit") if key not in entry]
        if missing:
            raise DdlbenchError(f"{at} lacks {', '.join(missing)}")
        sizes = entry["batch_sizes"]
        if not isinstance(sizes, list) or len(sizes) < 2 or not all(isinstance(b, int) and b > 0 for b in sizes):
            raise DdlbenchError(f"{at}.batch_sizes is {sizes!r}: give at least 2 positive integers")
        if not isinstance(entry["blocks"], list) or not entry["blocks"]:
            raise DdlbenchError(f"{at}.blocks is {entry['blocks']!r}: give one mapping per block of the model")
        _check_figure(entry["update_s"], f"{at}.update_s")
        _check_fit(entry["loss_fit"], f"{at}.loss_fit")
        for part in PER_BATCH:
            if part in entry:
                _check_per_batch(entry[part], len(sizes), f"{at}.{part}")
        for number, block in enumerate(entry["blocks"]):
            block_at = f"{at}.blocks[{number}]"
            if not isinstance(block, dict):
                raise DdlbenchError(f"{block_at} is {type(block).__name__}, not a mapping")
            for part in BLOCK_PARTS:
                if part not in block:
                    raise DdlbenchError(f"{block_at} lacks {part}")
                _check_per_batch(block[part], len(sizes), f"{block_at}.{part}")
                fit = part.removesuffix("_s") + "_fit"
                if fit in block:
                    _check_fit(block[fit], f"{block_at}.{fit}")


def _check_per_batch(figures: Any, count: int, at: str) -> None:
    if not isinstance(figures, list) or len(figures) != count:
        size = len(figures) if isinstance(figures, list) else type(figures).__name__
        raise DdlbenchError(f"{at} has {size} figure(s); give one per batch size ({count})")
    for index, figure in enumerate(figures):
        _check_figure(figure, f"{at}[{index}]")


def _check_figure(figure: Any, at: str) -> None:
    if not isinstance(figure, dict) or not _is_number(figure.get("value")):
        raise DdlbenchError(f"{at} is {figure!r}: give a mapping with a numeric value (seconds)")


def _check_fit(fit: Any, at: str) -> None:
    if not isinstance(fit, dict) or not all(_is_number(fit.get(key)) for key in ("alpha_s", "beta_s_per_sample")):
        raise DdlbenchError(f"{at} is {fit!r}: give numeric alpha_s and beta_s_per_sample")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
