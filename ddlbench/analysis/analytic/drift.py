"""The same predictions made again with the host's drift taken out: each configuration predicted from the
machine file as its own host probe says the host was while it ran (ddlbench.analysis.machine.host_speed).

A configuration's probe is the median over its ok repetitions of each probe figure of the table
(host_compute_s, host_copy_s, host_all_reduce_s: ddlbench.analysis.aggregate), at its ranks sharing a host
(host_at_once) and threads. The machine file is rescaled by that probe against the calibration's and the
configuration predicted from it; every repetition gets that one prediction, as the plain predictions give
every repetition its configuration's. What the score of these says is how far the model is off with the
host's speed as measured around each point; the gap to the plain score is what the calibration's minutes
cost. The ratios come from the points' own runs: a diagnosis, not a prediction made before running.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ddlbench.analysis.analytic.layout import Setting
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.predict import TableSource, introspected_table, predict
from ddlbench.analysis.machine.host_speed import HostSpeed, rescaled

PROBE_COLUMNS = {"compute_s": "host_compute_s", "copy_s": "host_copy_s", "all_reduce_s": "host_all_reduce_s"}


@dataclass(frozen=True, kw_only=True)
class Adjusted:
    """One configuration's probe, the speed its operator fits were set against, and its adjusted prediction."""

    config_key: str
    probe: dict[str, Any]
    operators: HostSpeed | None  # the speed the operator timings were rescaled by (None: the file has none)
    collectives: HostSpeed | None  # the first collective entry's
    step_time_s: float


def configuration_probe(rows: pd.DataFrame) -> dict[str, Any] | None:
    """The median over `rows` (one configuration's ok repetitions) of each probe figure; None when none probed."""
    if "host_compute_s" not in rows.columns or rows["host_compute_s"].dropna().empty:
        return None
    probe: dict[str, Any] = {}
    for name, column in PROBE_COLUMNS.items():
        values = rows[column].dropna() if column in rows.columns else pd.Series([], dtype=float)
        probe[name] = float(values.median()) if len(values) else None
    first = rows.iloc[0]
    return probe | {
        "at_once": int(first.get("host_at_once") or 1),
        "threads": int(first.get("host_threads") or 1),
        "ranks": int(first["world_size"]),
        "n": int(rows["host_compute_s"].notna().sum()),
    }


def host_adjusted(
    table: pd.DataFrame,
    machine: Mapping[str, Any],
    settings: Mapping[str, Setting],
    *,
    tables: TableSource = introspected_table,
) -> tuple[pd.DataFrame, list[Adjusted]]:
    """Predictions (one row per ok point of `table` that has a setting in `settings` and a probe, the columns
    of Prediction) from the machine file rescaled per configuration, and what each configuration was set
    against. A machine file without host_probes (calibrated before the probe) adjusts nothing: empty."""
    if not machine.get("host_probes"):
        return pd.DataFrame(), []
    ok = table[(table["status"] == "ok") & table["point_id"].isin(list(settings))]
    rows, adjusted = [], []
    for key, group in ok.groupby("config_key", sort=False):
        probe = configuration_probe(group)
        if probe is None:
            continue
        data, speeds = rescaled(machine, probe)
        model = MachineModel.from_dict(data, where="machine file rescaled by the host probe")
        prediction = predict(settings[group["point_id"].iloc[0]], model, tables=tables)
        for point_id in group["point_id"]:
            rows.append(prediction.to_dict() | {"point_id": point_id})
        adjusted.append(
            Adjusted(
                config_key=str(key),
                probe=probe,
                operators=next((s for name, s in speeds.items() if name.startswith("operators")), None),
                collectives=next((s for name, s in speeds.items() if name.startswith("collectives")), None),
                step_time_s=prediction.step_time_s,
            )
        )
    return pd.DataFrame(rows), adjusted
