"""What the report's data tables hold (ddlbench.report.tables encodes them): its configurations, with the
inside figures of each one's median repetition, and its points.

Configurations (ddlbench.analysis.configurations) are sorted by model and dataset first, so each
model × dataset section shows a contiguous slice of them (`pair_ranges`). Memory is shown in MiB
(2^20 bytes), phases and waits in ms. Columns with no value anywhere are left out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from ddlbench.analysis.keys import CONFIG_FIELDS, describe
from ddlbench.report.figures import missing, point_notes
from ddlbench.report.summary import cost_node_h, display_status
from ddlbench.report.tables import Spec, encode_table

MIB = 2**20
MS = 1e3
PERCENT = 100.0
# the fields that name a configuration in its tables even when the sweep holds them constant
SHOWN_FIELDS = ("model", "dataset", "strategy", "nodes", "ranks_per_node", "split", "batch_size", "micro_batches")
CONFIG_ORDER = ["model", "dataset", "strategy", "strategy_options", "nodes", "ranks_per_node", "split"]
CONFIG_ORDER += ["micro_batches", "batch_size", "setting"]
PHASES = (
    "data_s", "forward_s", "backward_s", "update_s", "other_s", "comm_exposed_s", "comm_hidden_s", "exposed_p2p_s"
)  # fmt: skip
# the median repetition's point figures carried onto its configuration's row
INSIDE_PREFIXES = (
    *(f"phase_{name}" for name in PHASES), "comm_overlap", "update_gap_s", "straggler_wait_s", "straggler_wait_share"
)  # fmt: skip
INSIDE_SINGLE = ("straggler_rank", "straggler_host", "straggler_slowest_steps", "straggler_steps", "trace_file")
# the median repetition's energy over its measured window (ddlbench.analysis.energy), carried the same way
ENERGY_SINGLE = ("samples_per_j", "samples_per_j_uncertainty", "energy_j", "energy_gpus", "energy_note")

CONFIG_SPECS = [
    Spec(key="point_id", kind="text"),
    Spec(key="model", kind="text"),
    Spec(key="dataset", kind="text"),
    Spec(key="strategy", kind="text"),
    Spec(key="strategy_options", kind="text"),
    Spec(key="nodes"),
    Spec(key="ranks_per_node"),
    Spec(key="split"),
    Spec(key="micro_batches"),
    Spec(key="batch_size"),
    Spec(key="setting", kind="text"),
    Spec(key="global_batch_size"),
    Spec(key="n_repetitions"),
    Spec(key="samples_per_s", kind="figure", source="rep_samples_per_s", n_column="n_repetitions",
         n_unit="repetitions", notes=True),
    Spec(key="samples_per_s_steps", kind="figure", source="samples_per_s", n_column="samples_per_s_n"),
    Spec(key="step_time_ms", kind="figure", source="step_time_s", n_column="step_time_s_n", factor=MS),
    Spec(key="vs_baseline"),
    Spec(key="baseline_samples_per_s"),
    Spec(key="speedup"),
    Spec(key="scaling_efficiency"),
    Spec(key="base_nodes"),
    Spec(key="cost_node_h"),
    Spec(key="samples_per_j"),
    Spec(key="warmup_dropped_steps"),
    Spec(key="split_flops_share"),
    Spec(key="tensor_peak_mib"),
    Spec(key="peak_rss_mib"),
    Spec(key="cuda_peak_mib"),
    Spec(key="local_parameters_max"),
    Spec(key="stages"),
    Spec(key="input_wait_s", kind="figure", n_column="input_wait_s_n"),
    Spec(key="input_wait_share", kind="figure", n_column="input_wait_share_n", factor=PERCENT),
    *(Spec(key=f"phase_{name}", kind="figure", factor=MS) for name in PHASES),
    Spec(key="comm_overlap", kind="figure", factor=PERCENT),
    Spec(key="update_gap_s", kind="figure", factor=MS),
    Spec(key="straggler_rank"),
    Spec(key="straggler_host", kind="text"),
    Spec(key="straggler_slowest_steps"),
    Spec(key="straggler_steps"),
    Spec(key="straggler_wait_s", kind="figure", factor=MS),
    Spec(key="straggler_wait_share", kind="figure", factor=PERCENT),
    Spec(key="trace", kind="link"),
]  # fmt: skip
# what each view of the configurations shows (keys of CONFIG_SPECS; absent columns are dropped)
OVERVIEW = [
    "strategy", "strategy_options", "nodes", "ranks_per_node", "split", "micro_batches", "batch_size", "setting",
    "global_batch_size", "samples_per_s", "samples_per_s_steps", "vs_baseline", "baseline_samples_per_s", "speedup",
    "scaling_efficiency", "base_nodes", "cost_node_h", "samples_per_j", "step_time_ms", "warmup_dropped_steps",
    "split_flops_share", "tensor_peak_mib", "peak_rss_mib", "cuda_peak_mib", "local_parameters_max", "stages",
    "input_wait_s", "input_wait_share",
]  # fmt: skip
PHASE_VIEW = [
    "strategy", "nodes", "ranks_per_node", "batch_size", "setting", "point_id", "step_time_ms",
    *(f"phase_{name}" for name in PHASES), "comm_overlap", "update_gap_s",
]  # fmt: skip
STRAGGLER_VIEW = [
    "strategy", "nodes", "ranks_per_node", "batch_size", "setting", "point_id", "straggler_rank", "straggler_host",
    "straggler_slowest_steps", "straggler_steps", "straggler_wait_s", "straggler_wait_share", "trace",
]  # fmt: skip
POINT_FIGURES = [
    Spec(key="status", kind="text"),
    Spec(key="reason", kind="text"),
    Spec(key="samples_per_s_point", kind="figure", source="samples_per_s", n_column="samples_per_s_n", notes=True),
    Spec(key="samples_per_s_overall"),
    # its interval is the throughput's, turned over (global batch ÷ the same order statistics)
    Spec(key="step_time_median_ms", source="step_time_s_median", factor=MS),
    Spec(key="warmup_dropped_steps"),
    Spec(key="samples_per_j"),
    Spec(key="energy_j"),
    # memory is in the configurations' tables (max over repetitions: a configuration's need); losses, every
    # figure of a point and its provenance in table.csv beside the report
    Spec(key="input_wait_s", kind="figure", n_column="input_wait_s_n"),
    Spec(key="input_wait_share", kind="figure", n_column="input_wait_share_n", factor=PERCENT),
    Spec(key="measurement_version"),
]


def varying(frame: pd.DataFrame, *, leave_out: tuple[str, ...] = ()) -> list[str]:
    """ddlbench.analysis.keys.varying_fields for a whole table at once, by column (a 10,000-row table's
    records take seconds to build)."""
    return [
        name
        for name in CONFIG_FIELDS
        if name not in leave_out and name in frame.columns and frame[name].astype(str).nunique() > 1
    ]


def options_text(value: Any) -> str:
    if missing(value):
        return ""
    options = json.loads(value) if isinstance(value, str) else dict(value)
    return " ".join(f"{key}={option}" for key, option in sorted(options.items())) or "default"


def with_memory_mib(frame: pd.DataFrame) -> pd.DataFrame:
    for name, column in (
        ("tensor_peak_mib", "tensor_peak_bytes"),
        ("peak_rss_mib", "peak_rss_bytes"),
        ("cuda_peak_mib", "cuda_peak_allocated_bytes"),
    ):
        values = frame[column] if column in frame.columns else pd.Series(float("nan"), index=frame.index)
        frame[name] = pd.to_numeric(values, errors="coerce") / MIB
    return frame


def configurations_frame(
    configs: pd.DataFrame, table: pd.DataFrame, *, report_dir: Path | None, sweep_dir: Path, one_host: bool = False
) -> pd.DataFrame:
    """The configurations, sorted by model, dataset and layout, with what the tables show of each: the other
    settings that vary, options as text, memory in MiB, cost (none when every "node" was a process on one
    host), and the inside figures of its median repetition (its point id, phases, straggler, trace)."""
    frame = configs.copy()
    own = ("model", "dataset", "nodes", "ranks_per_node", "strategy", "strategy_options", "micro_batches", "split")
    others = varying(frame, leave_out=(*own, "batch_size", "repetition"))
    frame["setting"] = [describe(row, others) for row in frame.to_dict("records")] if others else ""
    frame["strategy_options"] = frame["strategy_options"].map(options_text)
    frame = with_memory_mib(frame)
    throughput = frame["rep_samples_per_s_median"]
    frame["cost_node_h"] = [
        None if one_host else cost_node_h(n, value) for n, value in zip(frame["nodes"], throughput, strict=True)
    ]
    frame = _with_median_repetition(frame, table)
    frame["trace"] = [_relative(path, report_dir, sweep_dir) for path in frame["trace_file"]]
    frame = frame.sort_values(CONFIG_ORDER, kind="stable").reset_index(drop=True)
    return frame


def _with_median_repetition(frame: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    wanted = [f"{p}_{s}" for p in INSIDE_PREFIXES for s in ("median", "ci_low", "ci_high", "noisy")]
    columns = ["config_key", "repetition", "point_id", *INSIDE_SINGLE, *ENERGY_SINGLE, *wanted]
    inside = table[table["status"] == "ok"].reindex(columns=columns)
    inside = inside.rename(columns={"repetition": "median_repetition"})
    inside["median_repetition"] = pd.to_numeric(inside["median_repetition"])
    frame = frame.assign(median_repetition=pd.to_numeric(frame["median_repetition"]))
    joined = frame.merge(inside, on=["config_key", "median_repetition"], how="left", suffixes=("", "_point"))
    return joined.drop_duplicates("config_key").reset_index(drop=True)


def _relative(path: Any, report_dir: Path | None, sweep_dir: Path) -> str | None:
    if missing(path) or not path:
        return None
    target = Path(sweep_dir) / str(path)
    return str(target) if report_dir is None else os.path.relpath(target.resolve(), Path(report_dir).resolve())


def pair_ranges(frame: pd.DataFrame) -> dict[tuple[str, str], tuple[int, int]]:
    """Each model × dataset's rows [start, stop) in a frame sorted by model and dataset."""
    ranges: dict[tuple[str, str], tuple[int, int]] = {}
    for index, pair in enumerate(zip(frame["model"], frame["dataset"], strict=True)):
        key = (str(pair[0]), str(pair[1]))
        start, _ = ranges.get(key, (index, index))
        ranges[key] = (start, index + 1)
    return ranges


def present(frame: pd.DataFrame, specs: list[Spec]) -> list[Spec]:
    """The specs whose column holds at least one value."""
    kept = []
    for spec in specs:
        source = spec.source or spec.key
        name = f"{source}_median" if spec.kind == "figure" else source
        if name in frame.columns and frame[name].notna().any() and (frame[name].astype(str) != "").any():
            kept.append(spec)
    return kept


def configurations_table(frame: pd.DataFrame) -> dict[str, Any]:
    return encode_table(frame, present(frame, CONFIG_SPECS), notes=[";".join(point_notes(r)) for r in _notes(frame)])


def _notes(frame: pd.DataFrame) -> list[dict[str, Any]]:
    columns = [
        "other_measurement_version", "measurement_version", "measurement_versions", "oversubscribed", "shared_host_s",
    ]  # fmt: skip
    return frame[[c for c in (*columns, "any_oversubscribed") if c in frame.columns]].to_dict("records")


def points_table(table: pd.DataFrame) -> tuple[dict[str, Any], list[str]]:
    """Every point, in plan order: its naming fields and those the sweep varies, its status, and its own
    figures (configuration figures are in the configurations' tables). Returns the table and its keys."""
    varied = set(varying(table))
    fields = [name for name in CONFIG_FIELDS if name in SHOWN_FIELDS or name in varied]
    frame = table.copy()
    reasons = frame["reason"] if "reason" in frame.columns else [None] * len(frame)
    frame["status"] = [display_status(s, r) for s, r in zip(frame["status"], reasons, strict=True)]
    for name in ("strategy_options", "model_options"):
        if name in frame.columns:
            frame[name] = frame[name].map(options_text)
    frame = with_memory_mib(frame)
    naming = [Spec(key="point_id", kind="text")]
    naming += [
        Spec(key=name, kind="number" if _numeric(frame[name]) else "text")
        for name in [*fields, "repetition"]
        if name in frame.columns
    ]
    specs = naming + present(frame, POINT_FIGURES)
    encoded = encode_table(frame, specs, notes=[";".join(point_notes(r)) for r in _notes(frame)])
    return encoded, [spec.key for spec in specs]


def _numeric(values: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
