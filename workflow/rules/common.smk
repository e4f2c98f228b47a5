# The sweep, validated once with the same code the CLI uses; a bad config stops here with one line.
import json
import os
import sys

from ddlbench.calibrate.suite import calibration_cores
from ddlbench.errors import DdlbenchError
from ddlbench.launch.cores import check_plan_cores
from ddlbench.launch.resources import load_site
from ddlbench.launch.submission import check_plan_on_cluster, point_resources
from ddlbench.point import POINT_ID_PATTERN
from ddlbench.records import record_path
from ddlbench.sweep import plan_sweep

try:
    PLAN = plan_sweep(config)
    # `--profile slurm` names the site file; without it the points run on this host
    SITE = load_site(SITE_FILE) if SITE_FILE else None
    RESOURCES = point_resources(PLAN, SITE) if SITE else {}
    if SITE and "SLURM_JOB_ID" not in os.environ:  # on the login node, once, before any submission
        check_plan_on_cluster(PLAN, SITE)
    # local: Snakemake caps a job's threads at --cores, so a point could share cores unseen (`--lint`
    # parses the workflow with cores=1 whatever is asked, and runs nothing)
    if not SITE and "--lint" not in sys.argv:
        check_plan_cores(PLAN.points, workflow.resource_settings.cores)
except DdlbenchError as error:
    sys.stderr.write(f"ddlbench: invalid sweep config: {error}\n")
    sys.exit(2)

SWEEP_DIR = str(PLAN.config.sweep_dir)
REPORT = str(PLAN.config.report_path)
POINTS = PLAN.by_id()
RECORDS = [str(record_path(PLAN.config.sweep_dir, point_id)) for point_id in POINTS]
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


def point_spec(wildcards):
    return POINTS[wildcards.point].to_json()


def point_threads(wildcards):
    point = POINTS[wildcards.point]
    return point.world_size * point.cores_per_rank


def resource_of_point(key):
    def value(wildcards):
        return RESOURCES[wildcards.point][key]

    return value


# the same keys for every point (a Snakemake rule has one set); none when running locally
RUN_POINT_RESOURCES = {key: resource_of_point(key) for key in next(iter(RESOURCES.values()), {})}
