"""Predictions used before running: the points of a sweep the analytic model says will not fit in what their
host gives each rank, or will not finish within their `timeout_s`.

A first try of a sweep at a larger input ran six transformer points that were predicted to need 12 GB a rank
on a 23 GB host with two ranks, and 84 s a step against a 400 s limit: four were ended by the kernel's
out-of-memory killer and two ran past their limit. The predictions existed before the run. Here, on the
sweep's machine file (`machine:`), each point is predicted (ddlbench.analysis.analytic.predict) and flagged:

- memory: the busiest rank's predicted peak (bytes) above what one rank has: a GPU's memory on a CUDA
  machine; on a CPU machine the host's memory ÷ the ranks that share the host (`ranks_per_host`: a node's
  ranks on SLURM, every rank of the point when it runs locally);
- time: EXPECTED_LAUNCH_S + (warm-up + steps + 2 × replay steps) × the predicted step time (s) above the
  point's timeout_s (the replay trains `replay_steps` steps twice on one rank: at most a step's time each).

`predicted_misfits: skip` in the sweep leaves flagged points unrun, each with a record saying so (its status
the predicted failure, oom or timeout, its reason starting NOT_RUN); `run` (the default) runs them anyway, and
`ddlbench plan` and the pre-run check list them with their figures either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddlbench.errors import DdlbenchError
from ddlbench.point import Point

EXPECTED_LAUNCH_S = 15.0  # assumed: interpreter, torch import, process group, tear-down of one launch
NOT_RUN = "not run: predicted "  # the reason's start in the record of a point skipped for its prediction


@dataclass(frozen=True, kw_only=True)
class Misfit:
    """A point predicted not to fit (`memory`) or not to finish (`time`), with the figures in words."""

    point_id: str
    kind: str  # memory | time
    text: str  # "predicted peak 12.1 GB a rank, above the 11.5 GB a rank has (host 23.0 GB ÷ 2 ranks)"

    @property
    def status(self) -> str:
        """The record status of the failure predicted: oom or timeout."""
        return "oom" if self.kind == "memory" else "timeout"


def expected_seconds(point: Point, step_time_s: float) -> float:
    """The point's predicted duration, s: launch + (warm-up + steps + 2 × replay steps) × step time."""
    return EXPECTED_LAUNCH_S + (point.warmup_steps + point.steps + 2 * point.replay_steps) * step_time_s


def foresee(
    points: Sequence[Point],
    machine_file: Path | None,
    *,
    sweep_dir: Path | None = None,
    ranks_per_host: Callable[[Point], int] | None = None,
    host_bytes: dict[str, int] | None = None,
) -> tuple[list[Misfit], str]:
    """The flagged points (module docstring), and a line saying what they were predicted on (or why none).
    `host_bytes`, when given, is filled with each predicted point's bytes on its host: the busiest rank's
    predicted peak × the ranks that share the host (an upper bound)."""
    if machine_file is None or not Path(machine_file).exists():
        return [], "no machine file: nothing predicted before running"
    from ddlbench.analysis.analytic.layout import Setting
    from ddlbench.analysis.analytic.machine_model import MachineModel
    from ddlbench.analysis.analytic.predict import predict, sweep_tables

    machine = MachineModel.from_file(Path(machine_file))
    sharing = ranks_per_host or (lambda point: point.ranks_per_node)
    tables = sweep_tables(sweep_dir)
    misfits = []
    try:
        for point in points:
            limit, where = _rank_memory(machine, sharing(point))
            prediction = predict(
                Setting.of_point(point), machine, tables=tables, memory_per_device=limit, search_batch=False
            )
            if host_bytes is not None:
                host_bytes[point.point_id] = int(prediction.peak_memory_bytes) * sharing(point)
            if limit is not None and prediction.peak_memory_bytes > limit:
                text = f"predicted peak {_gb(prediction.peak_memory_bytes)} a rank, above the {_gb(limit)} a rank has"
                misfits.append(Misfit(point_id=point.point_id, kind="memory", text=f"{text} ({where})"))
            seconds = expected_seconds(point, prediction.step_time_s)
            if seconds > point.timeout_s:
                text = (
                    f"predicted {seconds:.0f} s ({EXPECTED_LAUNCH_S:g} s launch + "
                    f"{point.warmup_steps + point.steps + 2 * point.replay_steps} steps × "
                    f"{prediction.step_time_s:.3g} s), above its timeout_s {point.timeout_s:g}"
                )
                misfits.append(Misfit(point_id=point.point_id, kind="time", text=text))
    except DdlbenchError as exc:
        return [], f"not predicted on {machine_file} ({exc})"
    return misfits, f"predicted on {machine_file}"


def _rank_memory(machine, ranks_on_host: int) -> tuple[int | None, str]:
    """What one rank may use, bytes, and where that comes from; (None, …) where the machine file has no memory."""
    if not machine.memory_bytes:
        return None, "the machine file gives no memory"
    if machine.device_kind == "cpu":
        share = machine.memory_bytes // max(1, ranks_on_host)
        return share, f"host {_gb(machine.memory_bytes)} ÷ {ranks_on_host} rank(s)"
    return machine.memory_bytes, f"one {machine.device_kind} device's {_gb(machine.memory_bytes)}"


def _gb(value: float) -> str:
    return f"{value / 1e9:.1f} GB"
