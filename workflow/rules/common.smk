# What the sweep's rules read, from the plan the preamble (preamble.smk) validated and checked.
import json
import os

from ddlbench.calibrate.suite import calibration_cores
from ddlbench.launch.inside import inside_targets
from ddlbench.point import POINT_ID_PATTERN
from ddlbench.records import record_path

PLAN = PREPARED.plan
SWEEP_DIR = str(PLAN.config.sweep_dir)
REPORT = str(PLAN.config.report_path)
# a point's record, as the pattern run_point makes (ddlbench.records.record_path spells the layout once)
RECORD = str(record_path(PLAN.config.sweep_dir, "{point}"))
RECORDS = [str(record_path(PLAN.config.sweep_dir, point)) for point in POINTS]
TABLE = f"{SWEEP_DIR}/table.parquet"
# The records the target names (rule all). Snakemake runs a missing intermediate file again only when a
# job after it has to run, so a record deleted once the table is made (how a point is run again) would
# go unnoticed unless named. Only missing ones need naming, and only once the table or the report
# exists: before that the aggregate pulls every record in itself. Naming all of them doubles the edges
# Snakemake resolves: 1.5 s more to plan 10,000 points (benchmarks/plan_speed.py).
RECORDS_TO_NAME = (
    [record for record in RECORDS if not os.path.exists(record)]
    if (os.path.exists(TABLE) or os.path.exists(REPORT)) and not PREPARED.packed
    else []
)
# Inside an allocation with DDLBENCH_PACK=1 one job, `ddlbench run-packed`, runs every point without a
# record (rule run_inside_allocation); the records are then no job's outputs, and the report waits on
# that job's output and the earlier ones' instead (ddlbench.launch.inside.inside_targets says why).
INSIDE = inside_targets(PLAN.config.sweep_dir, POINTS) if PREPARED.packed else None
REPORT_INPUTS = list(INSIDE.runs) if INSIDE else RECORDS
CONFIG_JSON = json.dumps(PLAN.config.to_dict(), sort_keys=True)
# the machine the report predicts on: a given machine file, or one calibrated first from a suite
# (workflow/rules/predict.smk)
CALIBRATE_SUITE = PLAN.config.calibrate
MACHINE_FILE = str(PLAN.config.machine_path or "")
CALIBRATE_CORES = calibration_cores(CALIBRATE_SUITE) if CALIBRATE_SUITE else 1
CALIBRATE_RESOURCES = PREPARED.calibration_resources  # on this host: the `host` slot where the sweep runs alone
# what the report rule makes (ddlbench.finish): the table, its CSV, the scaling models, the report and its
# Markdown summary, and the predictions where the sweep knows its machine
FINISHED = [
    TABLE,
    f"{SWEEP_DIR}/table.csv",
    f"{SWEEP_DIR}/models.json",
    REPORT,
    f"{SWEEP_DIR}/report.md",
    *([f"{SWEEP_DIR}/predictions.csv"] if MACHINE_FILE else []),
]

wildcard_constraints:
    point=POINT_ID_PATTERN,
