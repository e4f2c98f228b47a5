"""The one road from a sweep's records to its results, which every front end takes: Snakemake's last
rule (`ddlbench report`), `ddlbench submit` and `rerun` once their jobs end, and `certify`.

In order, from the records on disk (nothing is measured here):
1. the table (table.parquet, and table.csv for other tools), ddlbench.analysis.aggregate;
2. the predictions (predictions.csv) where the sweep knows its machine (`machine:`, or the file its
   `calibrate:` suite wrote), ddlbench.analysis.analytic, stamped with the machine file's sha256;
3. the scaling models (models.json), ddlbench.analysis.empirical.sweep_models, stamped with the table's
   digest: fitted by forked workers while this process makes the others, the report waiting for them
   only where it draws them (a study's thousands of series take seconds, as long as the rest);
4. the sweep stored in the results database (history), ddlbench.history.store;
5. the report (report.html and report.md), rendered from the table read back from its parquet file,
   which refuses a derived artefact whose stamp (ddlbench.analysis.stamps) does not match.
Every artefact is written atomically. A step that cannot be made (the analytic model does not know a
model) is logged and leaves that artefact out, with the reason in the report; the others go on.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ddlbench.analysis.aggregate import build_table, save_table
from ddlbench.analysis.stamps import file_digest, sweep_stamp, table_digest
from ddlbench.atomic import write_text_atomic
from ddlbench.config import SweepConfig
from ddlbench.errors import DdlbenchError
from ddlbench.sweep import expand_sweep

log = logging.getLogger(__name__)

PREDICTIONS = "predictions.csv"
MODELS = "models.json"


@dataclass(frozen=True, kw_only=True)
class Finished:
    """What finishing a sweep wrote."""

    table: Path
    csv: Path
    predictions: Path | None  # None where the sweep knows no machine, or the model could not predict
    models: Path
    report: Path
    markdown: Path
    counts: dict[str, int]  # points by status
    history_run: int | None  # the run's id in the results database; None with history off
    history_db: Path | None
    notes: tuple[str, ...] = ()  # what could not be made, and why
    # wall-clock seconds of each step; the models are fitted beside the others, and "models" is only
    # the time to make their series and start their workers, and the report's wait for them
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        """One line a front end prints."""
        points = sum(self.counts.values())
        text = f"{points} points {self.counts}; report: {self.report.resolve()}"
        if self.history_run is not None:
            text += f"; history: run {self.history_run} in {self.history_db}"
        if self.seconds:
            steps = ", ".join(f"{step} {value:.1f}" for step, value in self.seconds.items())
            text += f"; finished in {sum(self.seconds.values()):.1f} s ({steps})"
        return text


def finish_sweep(
    config: SweepConfig,
    *,
    history: Path | None = None,
    store_history: bool = True,
    include_other_versions: bool = False,
    include_host_copied: bool = False,
    table_path: Path | None = None,
    csv_path: Path | None = None,
    report_path: Path | None = None,
    markdown_path: Path | None = None,
) -> Finished:
    """Table, predictions, scaling models, history and report of `config`'s sweep from its records (see
    the module's docstring). `history`: the results database (default: ddlbench.history.db.history_path)."""
    folder = Path(config.sweep_dir)
    table_path = table_path or folder / "table.parquet"
    csv_path = csv_path or folder / "table.csv"
    report_path = report_path or Path(config.report_path)
    markdown_path = markdown_path or report_path.with_suffix(".md")
    notes: list[str] = []

    seconds: dict[str, float] = {}
    began = time.perf_counter()

    def lap(step: str) -> None:
        nonlocal began
        now = time.perf_counter()
        seconds[step] = now - began
        began = now

    plan = expand_sweep(config)
    save_table(build_table(plan, include_other_versions=include_other_versions), parquet=table_path, csv=csv_path)
    table = pd.read_parquet(table_path)  # what the report and every later reader see
    lap("table")
    models_done = _start_models(config, table, folder / MODELS, notes)  # fitted by workers from here on
    lap("models")
    predictions = _write_predictions(config, plan.points, folder / PREDICTIONS, notes)
    lap("predictions")
    run_id, db = _store(config, table, history) if store_history else (None, None)
    lap("history")

    from ddlbench.report.render import render_reports

    waited = 0.0

    def models_ready() -> None:
        nonlocal waited
        start = time.perf_counter()
        models_done()
        waited = time.perf_counter() - start

    try:
        html, markdown = render_reports(
            config,
            table,
            include_other_versions=include_other_versions,
            include_host_copied=include_host_copied,
            report_dir=report_path.parent,
            models_ready=models_ready,
        )
    finally:
        models = models_done()  # written already where the report drew them; written now if it failed
    write_text_atomic(report_path, html)
    write_text_atomic(markdown_path, markdown)
    lap("report")
    seconds["report"] -= waited
    seconds["models"] += waited  # its series made and its workers started, then the report's wait
    counts = {str(k): int(v) for k, v in table["status"].value_counts().sort_index().items()}
    return Finished(
        table=table_path, csv=csv_path, predictions=predictions, models=models, report=report_path,
        markdown=markdown_path, counts=counts, history_run=run_id, history_db=db, notes=tuple(notes),
        seconds=seconds,
    )  # fmt: skip


def _write_predictions(config: SweepConfig, points, path: Path, notes: list[str]) -> Path | None:
    """predictions.csv of every point, stamped, where the sweep knows its machine; else none (a stale
    one is removed: it would speak of another configuration or machine)."""
    machine_file = config.machine_path
    if machine_file is None or not Path(machine_file).exists():
        if machine_file is not None:
            notes.append(f"no predictions: the machine file {machine_file} does not exist")
        path.unlink(missing_ok=True)
        return None
    from ddlbench.analysis.analytic.layout import Setting
    from ddlbench.analysis.analytic.machine_model import MachineModel
    from ddlbench.analysis.analytic.predict import predict_all, sweep_tables
    from ddlbench.analysis.analytic.render import CSV_COLUMNS

    try:
        machine = MachineModel.from_file(Path(machine_file))
        settings = [Setting.of_point(point) for point in points]
        predictions = predict_all(settings, machine, tables=sweep_tables(config.sweep_dir))
    except DdlbenchError as error:
        log.warning("no predictions: %s", error)
        notes.append(f"no predictions: {error}")
        path.unlink(missing_ok=True)
        return None
    stamp = sweep_stamp(config) | {"machine_sha256": file_digest(Path(machine_file))}
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*CSV_COLUMNS, *stamp], extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for prediction in predictions:
        writer.writerow(prediction.to_dict() | stamp)
    write_text_atomic(path, out.getvalue())
    return path


def _start_models(config: SweepConfig, table: pd.DataFrame, path: Path, notes: list[str]) -> Callable[[], Path]:
    """models.json of the table, stamped with its digest (where none can be fitted, why), begun: its models
    are fitted by forked workers (ddlbench.analysis.empirical.sweep_models.start_sweep_models) while this
    process goes on; the function returned waits for them, writes the file once and returns its path."""
    from ddlbench.analysis.empirical.sweep_models import start_sweep_models

    stamp = sweep_stamp(config) | {"table_sha256": table_digest(table)}
    written: list[Path] = []

    def why(error: DdlbenchError) -> dict:
        log.warning("no scaling models: %s", error)
        notes.append(f"no scaling models: {error}")
        return {"over": [], "models": [], "why": str(error)}

    try:
        fitted = start_sweep_models(config, table)
    except DdlbenchError as error:
        failed = why(error)
        fitted = lambda: failed  # noqa: E731

    def done() -> Path:
        if not written:
            try:
                models = fitted()
            except DdlbenchError as error:
                models = why(error)
            # one line: a study's models.json holds thousands of models and their curves (24 MB indented, 13 MB
            # not), machine-read (the report draws it; `python -m json.tool` shows it to a person)
            write_text_atomic(path, json.dumps(stamp | models, separators=(",", ":")) + "\n")
            written.append(path)
        return written[0]

    return done


def _store(config: SweepConfig, table: pd.DataFrame, history: Path | None) -> tuple[int, Path]:
    from ddlbench.history.db import history_path
    from ddlbench.history.store import store_sweep

    machine = None  # a calibrated sweep's machine figures go into the database with its training figures
    calibrated = Path(config.sweep_dir) / "machine.yaml"
    if config.calibrate and calibrated.exists():
        import yaml

        machine = yaml.safe_load(calibrated.read_text())
    db = history_path(history, results_dir=config.results_dir)
    run_id, _ = store_sweep(config, table, machine=machine, db=db)
    return run_id, db
