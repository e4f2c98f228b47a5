"""One road from records to results (ddlbench.finish): Snakemake's last rule and `ddlbench submit` make
the same table from the same records, byte for byte, and equivalent reports; derived artefacts carry the
stamp of what they were made from, and the report refuses one that does not match its table."""

from __future__ import annotations

import json
import re
import shutil

import pandas as pd
import yaml
from conftest import job_counts, run_cli, run_snakemake

from ddlbench.analysis.aggregate import build_table, save_table
from ddlbench.config import load_sweep_config
from ddlbench.finish import finish_sweep
from ddlbench.records import record_path
from ddlbench.sweep import expand_sweep
from tests.test_aggregate import record_for, write

MACHINE = "workflow/machines/abci_v100.yaml"


def sweep_with_records(write_sweep, **extra):
    """A sweep of ddp and zero2 over 1, 2 and 4 nodes, 3 launches each, with records written (nothing runs,
    so no core check: oversubscribe):
    ddp 100 samples/s per node, zero2 90, each launch 1 % apart."""
    path = write_sweep(
        models=["resnet8"], datasets=["cifar10"], strategies=["ddp", "zero2"], nodes=[1, 2, 4],
        repetitions=3, steps=5, warmup_steps=1, oversubscribe=True, **extra,
    )  # fmt: skip
    plan = expand_sweep(load_sweep_config(path))
    speed = {"ddp": 100.0, "zero2": 90.0}
    write(plan, [record_for(p, speed[p.strategy] * p.nodes * (1 + 0.01 * p.repetition)) for p in plan.points])
    return path, plan


def without_dates(markdown: str) -> str:
    """A report's Markdown without what differs between two renderings of the same table (its time)."""
    return re.sub(r"\d{4}-\d\d-\d\dT[\d:.+]+", "<time>", markdown)


def test_snakemake_and_submit_make_byte_identical_tables_and_equivalent_reports(write_sweep):
    path, plan = sweep_with_records(write_sweep, machine=MACHINE)
    folder = plan.config.sweep_dir
    result = run_snakemake("--cores", "1", "--configfile", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert job_counts(result).get("run_point", 0) == 0, "the records were there: no point runs"
    made = {name: (folder / name).read_bytes() for name in ("table.parquet", "table.csv", "report.md")}
    predictions = pd.read_csv(folder / "predictions.csv")
    models = json.loads((folder / "models.json").read_text())
    for name in ("table.parquet", "table.csv", "report.md", "report.html", "predictions.csv", "models.json"):
        (folder / name).unlink()

    # every point has a record: `ddlbench submit` submits nothing and finishes the sweep
    result = run_cli("submit", "--configfile", str(path))
    assert result.returncode == 0, result.stderr
    assert "every point" in result.stdout
    assert (folder / "table.parquet").read_bytes() == made["table.parquet"]
    assert (folder / "table.csv").read_bytes() == made["table.csv"]
    assert without_dates((folder / "report.md").read_text()) == without_dates(made["report.md"].decode())
    pd.testing.assert_frame_equal(pd.read_csv(folder / "predictions.csv"), predictions)
    assert json.loads((folder / "models.json").read_text()) == models
    # both roads made everything: predictions of every point, models over nodes, the run in the history
    assert len(predictions) == len(plan.points) and models["models"], models.get("why")
    html = (folder / "report.html").read_text()
    assert "Predicted beside measured" in html and "no predictions at" not in html


def test_a_stale_models_file_and_stale_predictions_are_refused_by_the_report(write_sweep, tmp_path):
    path, plan = sweep_with_records(write_sweep, machine=MACHINE)
    config = plan.config
    finished = finish_sweep(config, store_history=False)
    html = finished.report.read_text()
    assert "was made from something else" not in html
    fitted = json.loads(finished.models.read_text())
    assert fitted["models"] and fitted["config_hash"] == config.config_hash()

    # a point measured again, faster: the table changes, the old models.json stays beside it
    point = plan.points[-1]
    write(plan, [record_for(point, 900.0)])
    # the table made again (as a partial finish would leave it), the old models.json stays beside it
    save_table(
        build_table(expand_sweep(config)),
        parquet=config.sweep_dir / "table.parquet",
        csv=config.sweep_dir / "table.csv",
    )
    result = run_cli("-q", "report", "--configfile", str(path), "--table", str(config.sweep_dir / "table.parquet"))
    assert result.returncode == 0, result.stderr
    html = config.report_path.read_text()
    assert "models.json was made from something else (table_sha256" in html
    assert "Scaling models" in html and "<svg" in html

    # a machine file changed after the predictions were made: they are refused too
    machine = tmp_path / "machine.yaml"
    shutil.copy(MACHINE, machine)
    moved = write_sweep("moved.yaml", **(yaml.safe_load(path.read_text()) | {"machine": str(machine)}))
    moved_config = load_sweep_config(moved)
    finish_sweep(moved_config, store_history=False)
    data = yaml.safe_load(machine.read_text())
    data["name"] = f"{data.get('name', 'machine')} (edited)"
    machine.write_text(yaml.safe_dump(data))
    finish_sweep_render_only = run_cli(
        "-q", "report", "--configfile", str(moved), "--table", str(moved_config.sweep_dir / "table.parquet")
    )
    assert finish_sweep_render_only.returncode == 0, finish_sweep_render_only.stderr
    html = moved_config.report_path.read_text()
    assert "predictions.csv was made from something else (machine_sha256" in html

    # `ddlbench report` from the records makes them afresh, and they are shown again
    result = run_cli("-q", "report", "--configfile", str(moved))
    assert result.returncode == 0, result.stderr
    html = moved_config.report_path.read_text()
    assert "was made from something else" not in html and "Predicted beside measured" in html


def test_an_unstamped_models_file_is_refused_with_the_remedy(write_sweep):
    path, plan = sweep_with_records(write_sweep)
    finished = finish_sweep(plan.config, store_history=False)
    data = json.loads(finished.models.read_text())
    for key in ("config_hash", "measurement_version", "table_sha256"):
        data.pop(key)
    finished.models.write_text(json.dumps(data))
    result = run_cli("-q", "report", "--configfile", str(path), "--table", str(finished.table))
    assert result.returncode == 0, result.stderr
    html = finished.report.read_text()
    assert "carries no config_hash, measurement_version, table_sha256" in html
    assert "`ddlbench report` fits them again" in html


def test_finishing_with_a_point_missing_keeps_every_other_figure(write_sweep):
    """A sweep with a point not yet run finishes with the rest: the table lists it as missing."""
    _, plan = sweep_with_records(write_sweep)
    record_path(plan.config.sweep_dir, plan.points[0].point_id).unlink()
    finished = finish_sweep(plan.config, store_history=False)
    table = pd.read_parquet(finished.table)
    assert len(table) == len(plan.points)
    assert finished.counts.get("ok") == len(plan.points) - 1
