# The sweep, validated once with the same code the CLI uses; a bad config stops here with one line.
import json
import sys

from ddlbench.errors import ConfigError
from ddlbench.sweep import POINT_ID_PATTERN, plan_sweep

try:
    PLAN = plan_sweep(config)
except ConfigError as error:
    sys.stderr.write(f"ddlbench: invalid sweep config: {error}\n")
    sys.exit(2)

SWEEP_DIR = str(PLAN.config.sweep_dir)
REPORT = str(PLAN.config.report_path)
POINTS = PLAN.by_id()
RECORDS = [f"{SWEEP_DIR}/points/{point_id}/record.json" for point_id in POINTS]
CONFIG_JSON = json.dumps(PLAN.config.to_dict(), sort_keys=True)


wildcard_constraints:
    point=POINT_ID_PATTERN,


def point_spec(wildcards):
    return POINTS[wildcards.point].to_json()


def point_threads(wildcards):
    point = POINTS[wildcards.point]
    return point.world_size * point.threads
