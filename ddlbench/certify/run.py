"""Running a certification suite through the normal paths, or reading one that ran, into a table.

Run: the resolved suite is written beside its results and the project's Snakefile runs it, locally with
`--cores`, or on SLURM with `--profile` (the site profile of `ddlbench profile slurm`). Points that fail
write records that say so; whatever the workflow's exit status, the certificate is then built from the
records there are (a failed calibration leaves its figures unmeasured, not the certificate unwritten).

Read (`--from-records DIR`): every record under DIR/points/ and DIR/machine.yaml, whatever suite wrote
them; only records of this measurement version count (ddlbench.analysis.aggregate).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ddlbench.analysis.aggregate import add_configuration_columns, build_table, record_row
from ddlbench.atomic import write_text_atomic
from ddlbench.config import SweepConfig, load_sweep_config
from ddlbench.errors import DdlbenchError
from ddlbench.records import PointRecord, RecordError, read_record
from ddlbench.sweep import expand_sweep

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]


def run_suite(config: SweepConfig, *, cores: int, profile: str | None, history: Path) -> tuple[int, Path]:
    """Run the resolved suite with Snakemake; (its exit status, its log file). Its report rule finishes
    the suite (ddlbench.finish) and stores it in `history`, the database the certificate goes to."""
    config.sweep_dir.mkdir(parents=True, exist_ok=True)
    suite_file = config.sweep_dir / "suite.yaml"
    write_text_atomic(suite_file, yaml.safe_dump(config.to_dict(), sort_keys=False))
    snakemake = Path(sys.executable).with_name("snakemake")
    command = [str(snakemake) if snakemake.exists() else "snakemake", "--snakefile", str(REPO / "Snakefile")]
    # --keep-going: a failed step (a prediction, say) must not keep the rest of the suite from running
    command += ["--configfile", str(suite_file), "--cores", str(cores), "--rerun-incomplete", "--keep-going"]
    if profile:
        command += ["--profile", profile]
    log_file = config.sweep_dir / "logs" / "certify-snakemake.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log.info("running the suite: %s (log: %s)", " ".join(command), log_file)
    # the rules call `ddlbench`: this interpreter's, also when its environment is not activated
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DDLBENCH_HISTORY": str(history.resolve()),
    }
    with log_file.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    return done.returncode, log_file


def run_suite_packed(config: SweepConfig, *, pack: str, history: Path) -> tuple[int, Path]:
    """Run the resolved suite's points as job steps of allocations of `pack` nodes (`auto`: as wide as the
    widest point; `all`: the whole partition at once for per-node points; within the user's limits:
    ddlbench.launch.packed), wait, and finish the suite as every road does (ddlbench.finish: table, models,
    the run in `history`, report); (0, or 1 when a point has no record or an allocation ended before it
    ran, and the log file). Points that have a record are not run again."""
    from ddlbench.finish import finish_sweep
    from ddlbench.launch.packed import submit_packed_sweep
    from ddlbench.launch.profile import load_default_site
    from ddlbench.records import record_path

    if config.calibrate:
        raise DdlbenchError(
            "--pack runs a suite's training points; a suite with `calibrate:` runs with --profile slurm"
        )
    config.sweep_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(config.sweep_dir / "suite.yaml", yaml.safe_dump(config.to_dict(), sort_keys=False))
    plan = expand_sweep(config)
    points = [point for point in plan.points if not record_path(config.sweep_dir, point.point_id).exists()]
    log_file = config.sweep_dir / "logs" / "certify-packed.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a") as out:
        if points:
            submit_packed_sweep(config, points, load_default_site(), pack, say=lambda line: print(line, file=out))
        finished = finish_sweep(config, history=history)
        print(finished.summary(), file=out)
        unrun = [point.point_id for point in plan.points if _left_unrun(record_path(config.sweep_dir, point.point_id))]
        if unrun:
            print(f"{len(unrun)} point(s) not run (their allocation ended first): {', '.join(unrun)}", file=out)
    return (1 if finished.counts.get("missing") or unrun else 0), log_file


def _left_unrun(path: Path) -> bool:
    from ddlbench.launch.allocation import left_unrun
    from ddlbench.records import RecordError, read_record

    try:
        return path.exists() and left_unrun(read_record(path).reason)
    except RecordError:
        return False


def suite_table(config: SweepConfig) -> pd.DataFrame:
    """One row per planned point of the suite (a missing record is a `missing` row)."""
    return build_table(expand_sweep(config))


def records_table(records: list[PointRecord]) -> pd.DataFrame:
    """One row per record (folder_records: any suite's)."""
    return add_configuration_columns(pd.DataFrame([record_row(record) for record in records]))


def folder_records(folder: Path) -> list[PointRecord]:
    """Every readable record under `folder`/points/ (any suite's); none at all is refused."""
    paths = sorted((folder / "points").glob("*/record.json"))
    if not paths:
        raise DdlbenchError(f"--from-records {folder}: no records under {folder / 'points'}")
    records = []
    for path in paths:
        try:
            records.append(read_record(path))
        except RecordError as exc:
            log.warning("skipping %s: %s", path, exc)
    if not records:
        raise DdlbenchError(f"--from-records {folder}: none of the {len(paths)} records could be read")
    return records


def suite_records(config: SweepConfig) -> list[PointRecord]:
    """The records of the suite's planned points that exist and can be read."""
    from ddlbench.records import record_path

    records = []
    for point in expand_sweep(config).points:
        path = record_path(config.sweep_dir, point.point_id)
        try:
            records.append(read_record(path))
        except (OSError, RecordError):
            continue
    return records


def read_machine(folder: Path) -> dict[str, Any] | None:
    """The calibration's machine file in the sweep folder, None when the suite has none or it failed."""
    path = folder / "machine.yaml"
    if not path.exists():
        return None
    return yaml.safe_load(path.read_text())


def records_config_hash(folder: Path, table: pd.DataFrame) -> str:
    """The config hash of records read back: their suite's, when `certify` ran it there (suite.yaml),
    else the hash of the configurations found (so the same records always get the same hash)."""
    if (folder / "suite.yaml").exists():
        return load_sweep_config(folder / "suite.yaml").config_hash()
    keys = sorted(set(table["config_key"]))
    return hashlib.sha256(json.dumps(keys).encode()).hexdigest()
