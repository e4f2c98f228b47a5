# What the sweep's rules read, from the plan the preamble (preamble.smk) validated and checked.
import json

from ddlbench.calibrate.suite import calibration_cores
from ddlbench.point import POINT_ID_PATTERN
from ddlbench.records import record_path

PLAN = PREPARED.plan
SWEEP_DIR = str(PLAN.config.sweep_dir)
REPORT = str(PLAN.config.report_path)
# a point's record, as the pattern run_point makes (ddlbench.records.record_path spells the layout once)
RECORD = str(record_path(PLAN.config.sweep_dir, "{point}"))
RECORDS = expand(RECORD, point=list(POINTS))
CONFIG_JSON = json.dumps(PLAN.config.to_dict(), sort_keys=True)
# predictions (workflow/rules/predict.smk): a given machine file, or one calibrated first from a suite
CALIBRATE_SUITE = PLAN.config.calibrate
MACHINE_FILE = str(PLAN.config.machine_path or "")
PREDICTIONS = f"{SWEEP_DIR}/predictions.csv" if MACHINE_FILE else ""
CALIBRATE_CORES = calibration_cores(CALIBRATE_SUITE) if CALIBRATE_SUITE else 1
# empirical scaling models of the measured figures (workflow/rules/scaling.smk), which the report draws
SCALING_MODELS = f"{SWEEP_DIR}/models.json"


wildcard_constraints:
    point=POINT_ID_PATTERN,
