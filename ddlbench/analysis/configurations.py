"""One row per configuration: its repetitions summarised, its speedup over nodes, and its ratio to ddp.

A configuration is every Point field but `repetition` (ddlbench.analysis.keys); its repetitions are
independent launches of it. Only successful records of this measurement version take part, unless
`include_other_versions`: figures of another version measure something else.

Two levels of statistics, both nonparametric (ddlbench.statistics; Hoefler & Belli's rules 5 and 6):

- over repetitions, rep_samples_per_s_*: each repetition contributes its window throughput,
  samples_per_s_overall = samples of the kept window ÷ its wall time (rule 3: a rate over a window is
  total work over total time, not a mean of per-step rates); the median over repetitions, its 95 % CI
  (None below 6 repetitions), CV and noise flag; rep_samples_per_s_values lists each repetition's
  (a JSON list in repetition order), what verdicts between configurations compare
  (ddlbench.analysis.verdicts). rep_step_time_s_* does the same with each
  repetition's mean step time of the window, global_batch_size ÷ samples_per_s_overall (seconds);
- over steps, samples_per_s_* and step_time_s_* (and input_wait_s_*, input_wait_share_* where the
  point read through a loader): the step statistics (records.Stats) of the median repetition, the
  one whose window throughput is the (lower) median: a real run, with its own CI.

Speedup (rule 1: the base is named and its absolute figure kept beside every speedup): within a
series, speedup(n) = T(n) / T(n0) and scaling_efficiency(n) = speedup(n) / (n / n0), with
T = rep_samples_per_s_median and n0 the series' smallest node count, kept as base_nodes and
base_samples_per_s (samples/s). Dimensionless. The series is the one a reader compares: equal global batch
over nodes (strong scaling, ddlbench.analysis.keys.strong_series_key, what the summary holds equal) where
the sweep ran a global batch at two node counts or more, else equal per-replica batch (weak scaling,
series_key); `scaling_held` says which, `scaling_key` names it. A configuration in neither has no speedup
(NaN), never a speedup of 1 over itself.

vs_baseline = T ÷ T of the ddp configuration like for like (ddlbench.analysis.keys.comparison_key):
equal in every field but the strategy's own (strategy, strategy_options, split, micro_batches) and the
per-replica batch, at the same global batch (Point.global_batch_size, samples per optimizer step): ddp
at its default options, or the only ddp variant there is. Where no ddp ran at that global batch, the ddp
configuration at the same per-replica batch_size (then the two run different global batches), and
where there is none either, no ratio. baseline_held_equal says which: "global batch", "per-replica
batch" or "no ddp alike". A ratio of medians; ratios are never averaged (rule 4).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pandas as pd

from ddlbench.analysis.keys import BASELINE_STRATEGY, CONFIG_FIELDS
from ddlbench.statistics import coefficient_of_variation, is_noisy, median_ci, percentile

KEY_COLUMNS = ("config_key", "series_key", "strong_series_key", "baseline_key", "baseline_replica_key")
SIZE_COLUMNS = ("world_size", "replicas", "global_batch_size")
STEP_COLUMNS = tuple(
    f"{figure}_{name}"
    for figure in ("samples_per_s", "step_time_s", "input_wait_s", "input_wait_share")
    for name in ("n", "median", "ci_low", "ci_high", "cv", "noisy", "p5", "p95")
)
REP_STATS = ("median", "ci_low", "ci_high", "cv", "noisy")
# figures that belong to the configuration, repeated on each point row that fed them (aggregate)
POINT_SUMMARY_COLUMNS = [
    "n_repetitions",
    "repetitions_not_ok",
    "repetitions_other_version",
    *(f"rep_samples_per_s_{name}" for name in REP_STATS),
    *(f"rep_step_time_s_{name}" for name in REP_STATS),
    "median_repetition",
    "rep_samples_per_s_values",
    "any_oversubscribed",
    "speedup",
    "scaling_efficiency",
    "base_nodes",
    "base_samples_per_s",
    "scaling_held",
    "scaling_key",
    "vs_baseline",
    "baseline_samples_per_s",
    "baseline_config_key",
    "baseline_held_equal",
]
# the largest over repetitions (memory, parameters, stages, dropped warm-up steps)
MAX_COLUMNS = (
    "shared_host_s",  # the longest any repetition ran beside other points on its host
    "peak_rss_bytes",
    "tensor_peak_bytes",
    "tensor_resident_bytes",
    "cuda_peak_allocated_bytes",
    "local_parameters_max",
    "stages",
    "warmup_dropped_steps",
)
# the first repetition's statement (facts that do not change between launches)
FIRST_COLUMNS = ("split_flops_share", "gradient_path", "gradient_reduction", "mesh", "cores_note")
# what else a point row contributes: its status, version, window throughput and flags
READ_COLUMNS = (
    "status", "repetition", "measurement_version", "other_measurement_version", "samples_per_s_overall",
    "oversubscribed",
)  # fmt: skip
SUMMARY_COLUMNS = [
    *KEY_COLUMNS,
    *CONFIG_FIELDS,
    *SIZE_COLUMNS,
    *POINT_SUMMARY_COLUMNS,
    "baseline_strategy_options",
    "measurement_versions",
    "other_measurement_version",
    *STEP_COLUMNS,
    *MAX_COLUMNS,
    *FIRST_COLUMNS,
]


def summarize_configurations(table: pd.DataFrame, *, include_other_versions: bool = False) -> pd.DataFrame:
    """One row per configuration with at least one successful repetition taking part (SUMMARY_COLUMNS)."""
    if table.empty or "samples_per_s_overall" not in table.columns:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    not_ok: dict[str, int] = defaultdict(int)
    other_version: dict[str, int] = defaultdict(int)
    # only the columns read here: a wide table's records take seconds to build
    read = [*KEY_COLUMNS, *CONFIG_FIELDS, *SIZE_COLUMNS, *STEP_COLUMNS, *MAX_COLUMNS, *FIRST_COLUMNS, *READ_COLUMNS]
    for row in table[[column for column in dict.fromkeys(read) if column in table.columns]].to_dict("records"):
        other = bool(_value(row.get("other_measurement_version")))
        if row["status"] != "ok":
            not_ok[row["config_key"]] += 1
        elif other and not include_other_versions:
            other_version[row["config_key"]] += 1
        else:
            groups[row["config_key"]].append(row)
    rows = [
        _summarize(key, reps) | {"repetitions_not_ok": not_ok[key], "repetitions_other_version": other_version[key]}
        for key, reps in groups.items()
    ]
    if not rows:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    summary = pd.DataFrame(rows)
    summary = add_baseline(add_scaling(summary))
    return summary.reindex(columns=SUMMARY_COLUMNS)


def _summarize(key: str, reps: list[dict[str, Any]]) -> dict[str, Any]:
    first = reps[0]
    row: dict[str, Any] = {name: first.get(name) for name in (*KEY_COLUMNS, *CONFIG_FIELDS, *SIZE_COLUMNS)}
    row.pop("repetition", None)
    throughput = [float(rep["samples_per_s_overall"]) for rep in reps]
    step_time = [float(first["global_batch_size"]) / value for value in throughput]  # seconds per step
    row |= {"n_repetitions": len(reps)}
    row |= _rep_stats("rep_samples_per_s", throughput) | _rep_stats("rep_step_time_s", step_time)
    ordered = sorted(reps, key=lambda rep: (float(rep["samples_per_s_overall"]), rep["repetition"]))
    median_rep = ordered[(len(ordered) - 1) // 2]
    row["median_repetition"] = median_rep["repetition"]
    # each launch's window throughput, in repetition order: what verdicts compare (ddlbench.analysis.verdicts)
    by_repetition = sorted(reps, key=lambda rep: rep["repetition"])
    row["rep_samples_per_s_values"] = json.dumps([float(rep["samples_per_s_overall"]) for rep in by_repetition])
    row |= {column: _value(median_rep.get(column)) for column in STEP_COLUMNS}
    versions = sorted({int(rep["measurement_version"]) for rep in reps if _value(rep.get("measurement_version"))})
    row["measurement_versions"] = ",".join(str(version) for version in versions)
    row["other_measurement_version"] = any(bool(_value(rep.get("other_measurement_version"))) for rep in reps)
    row["any_oversubscribed"] = any(bool(_value(rep.get("oversubscribed"))) for rep in reps)
    for column in MAX_COLUMNS:
        values = [value for rep in reps if (value := _value(rep.get(column))) is not None]
        row[column] = max(values) if values else None
    for column in FIRST_COLUMNS:
        row[column] = next((value for rep in reps if (value := _value(rep.get(column))) not in (None, "")), None)
    return row


def _rep_stats(prefix: str, values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    median = percentile(ordered, 50)
    ci = median_ci(ordered)
    return {
        f"{prefix}_median": median,
        f"{prefix}_ci_low": ci[0] if ci else None,
        f"{prefix}_ci_high": ci[1] if ci else None,
        f"{prefix}_cv": coefficient_of_variation(ordered),
        f"{prefix}_noisy": is_noisy(median, ci),
    }


def add_scaling(summary: pd.DataFrame) -> pd.DataFrame:
    """speedup, scaling_efficiency, base_nodes, base_samples_per_s, scaling_held and scaling_key of each
    configuration: within its strong series (equal global batch over nodes) where that has two node counts
    or more, else within its series (equal per-replica batch) where that has, else none (NaN: a
    configuration alone at its batch has no speedup, rather than a speedup of 1 over itself)."""
    if "strong_series_key" not in summary.columns:  # a table from before the key: weak series only
        summary = summary.assign(strong_series_key=None)
    counts = {key: summary.groupby(key, dropna=False)["nodes"].transform("nunique") for key in SCALING_KEYS}
    chosen = pd.Series([None] * len(summary), index=summary.index, dtype=object)
    held = pd.Series([None] * len(summary), index=summary.index, dtype=object)
    for key, words in SCALING_KEYS.items():
        use = chosen.isna() & summary[key].notna() & (counts[key] >= 2)
        chosen[use] = key + ":" + summary.loc[use, key].astype(str)
        held[use] = words
    summary = summary.assign(scaling_key=chosen, scaling_held=held)
    scaled = summary[summary["scaling_key"].notna()]
    first = scaled.sort_values("nodes", kind="stable").groupby("scaling_key", sort=False).head(1)
    first = first.set_index("scaling_key")
    base_nodes = summary["scaling_key"].map(first["nodes"])
    base = summary["scaling_key"].map(first["rep_samples_per_s_median"]).astype(float)
    speedup = summary["rep_samples_per_s_median"].astype(float) / base
    summary = summary.assign(speedup=speedup, scaling_efficiency=speedup / (summary["nodes"] / base_nodes))
    summary["base_nodes"] = [None if n != n else int(n) for n in base_nodes]
    summary["base_samples_per_s"] = base
    return summary


# the series a speedup is computed in, in order of preference, and what each holds equal over nodes
SCALING_KEYS = {"strong_series_key": "global batch", "series_key": "per-replica batch"}


HELD_EQUAL = {"baseline_key": "global batch", "baseline_replica_key": "per-replica batch"}
NO_BASELINE = f"no {BASELINE_STRATEGY} alike"


def add_baseline(summary: pd.DataFrame) -> pd.DataFrame:
    """vs_baseline, the ddp configuration it divides by (its key, options and samples/s) and which batch
    the two hold equal (baseline_held_equal): the global batch where such a ddp ran, else the per-replica one."""
    ddp = summary.loc[summary["strategy"] == BASELINE_STRATEGY]
    found = {column: _baselines(ddp, column) for column in HELD_EQUAL}
    base, held = [], []
    for row in summary[list(HELD_EQUAL)].to_dict("records"):
        column = next((column for column in HELD_EQUAL if row[column] in found[column]), None)
        base.append(found[column][row[column]] if column else None)
        held.append(HELD_EQUAL[column] if column else NO_BASELINE)
    summary["baseline_samples_per_s"] = [b["rep_samples_per_s_median"] if b else float("nan") for b in base]
    summary["baseline_config_key"] = [b["config_key"] if b else None for b in base]
    summary["baseline_strategy_options"] = [b["strategy_options"] if b else None for b in base]
    summary["baseline_held_equal"] = held
    summary["vs_baseline"] = summary["rep_samples_per_s_median"] / summary["baseline_samples_per_s"]
    return summary


def _baselines(ddp: pd.DataFrame, key_column: str) -> dict[str, dict[str, Any]]:
    """Per key, the one ddp configuration to divide by: the one at default options, or the only one."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    columns = [key_column, "config_key", "strategy_options", "rep_samples_per_s_median"]
    for row in ddp[columns].to_dict("records"):
        groups[row[key_column]].append(row)
    baselines = {}
    for key, candidates in groups.items():
        chosen = [c for c in candidates if _no_options(c["strategy_options"])] or candidates
        if len(chosen) == 1:
            baselines[key] = chosen[0]
    return baselines


def _no_options(options: object) -> bool:
    return not json.loads(options or "{}") if isinstance(options, str) else not options


def _value(value: Any) -> Any:
    """None for pandas' missing values (NaN, NA), the value otherwise."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, float) and value != value:
        return None
    return value
