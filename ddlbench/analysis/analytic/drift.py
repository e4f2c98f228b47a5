"""The same predictions made again with the host's drift taken out: each configuration predicted from the
machine file as the host probes of the sweep say the host was while its points ran
(ddlbench.analysis.machine.host_speed).

The sweep's probe is, per count of ranks probing at once on a host (host_at_once), job size and threads, the
median over every ok point of the table of each probe figure (host_compute_s, host_copy_s, host_all_reduce_s:
ddlbench.analysis.aggregate). Pooled over the sweep rather than per configuration: one launch's probe moves by
±10 % from process to process on the 2-core development host (three repetitions of one configuration read
2.07, 2.50 and 2.51 ms) where its steps agree to 4 %, so a configuration's own probe would add that noise to
its prediction; what is taken out is the calibration's offset from the sweep as a whole (a calibration run in
a slow spell), not each point's. The machine file is rescaled by that probe against the calibration's, and
each configuration predicted from it; every repetition gets that one prediction, as the plain predictions
give every repetition its configuration's. What the score of these says is how far the model is off with
the host's speed during the sweep; the gap to the plain score is what the calibration's minutes cost. The
ratios come from the sweep's own runs: a diagnosis, not a prediction made before running.
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
    """One configuration's probe and the speeds its operator fits and collectives were set against."""

    config_key: str
    probe: dict[str, Any]
    operators: HostSpeed | None  # the speed the operator timings were rescaled by (None: the file has none)
    collectives: HostSpeed | None  # the first collective entry's


def pooled_probe(rows: pd.DataFrame) -> dict[str, Any] | None:
    """The median over `rows` (ok points of one count of ranks at once, job size and threads) of each probe
    figure; None when none probed."""
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
    of Prediction) from the machine file rescaled by the sweep's probe (module docstring), and what each
    configuration was set against. A machine file without host_probes (calibrated before the probe) adjusts
    nothing: empty."""
    if not machine.get("host_probes"):
        return pd.DataFrame(), []
    ok = table[table["status"] == "ok"]
    groups = [c for c in ("host_at_once", "world_size", "host_threads") if c in ok.columns]
    probes = {key: pooled_probe(group) for key, group in ok.groupby(groups, dropna=False)} if groups else {}
    rows, adjusted = [], []
    machines: dict[tuple, tuple[MachineModel, dict[str, HostSpeed]]] = {}
    for key, group in ok[ok["point_id"].isin(list(settings))].groupby("config_key", sort=False):
        shared = tuple(group.iloc[0][c] for c in groups)
        probe = probes.get(shared)
        if probe is None:
            continue
        if shared not in machines:
            data, speeds = rescaled(machine, probe)
            machines[shared] = (MachineModel.from_dict(data, where="machine file rescaled by the host probe"), speeds)
        model, kept = machines[shared]
        prediction = predict(settings[group["point_id"].iloc[0]], model, tables=tables)
        for point_id in group["point_id"]:
            rows.append(prediction.to_dict() | {"point_id": point_id})
        adjusted.append(
            Adjusted(
                config_key=str(key),
                probe=probe,
                operators=next((s for name, s in kept.items() if name.startswith("operators")), None),
                collectives=next((s for name, s in kept.items() if name.startswith("collectives")), None),
            )
        )
    return pd.DataFrame(rows), adjusted
