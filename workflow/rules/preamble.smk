# Every workflow starts here: the Snakefile, workflow/adaptive.smk and workflow/calibrate.smk, each after
# setting WORKFLOW_KIND (sweep | adaptive | calibration). Its config is validated and planned once, and
# the checks every workflow makes before anything is scheduled are made (ddlbench.preflight: the
# live cluster's limits on the login node under `--profile slurm`, the local --cores otherwise). A
# refusal is one line naming the key or point, and exit status 2.
import sys

from snakemake.common import get_function_params, overwrite_function_params

from ddlbench.errors import DdlbenchError
from ddlbench.launch.order import run_priorities
from ddlbench.preflight import prepare_workflow, refusal

# The profile `slurm` passes its site file as config key slurm_site; the rest of config is the sweep
# (or the calibration suite).
SITE_FILE = config.pop("slurm_site", None)

# A --configfile replaces the default sweep instead of being merged into it: a merged sweep would keep
# axes and exclusions the user never wrote. (Without one, calibrate.smk runs the package's default suite.)
if not config and WORKFLOW_KIND != "calibration":

    configfile: "workflow/config/default.yaml"

    config.pop("slurm_site", None)  # Snakemake applies --config again over a configfile


try:
    PREPARED = prepare_workflow(
        WORKFLOW_KIND,
        config,
        site_file=SITE_FILE,
        cores=workflow.resource_settings.cores,
        linting="--lint" in sys.argv,
        jobs=workflow.resource_settings.nodes,
        # -n, alone or among short flags (-np), --dry-run, --dryrun: nothing is written, not even a record
        dry_run=any(a in ("--dry-run", "--dryrun") or (a[:1] == "-" and a[1:2] != "-" and "n" in a[1:]) for a in sys.argv),
    )
except DdlbenchError as error:
    sys.stderr.write(refusal(WORKFLOW_KIND, error))
    sys.exit(2)

# point id → its SLURM allocation as Snakemake resources; on this host, its predicted memory (mem_mb) where
# the sweep's machine file predicts every point, and this host's memory as the bound of the points run at
# once (unless --resources gave one): Snakemake starts a point only while the memory of those running leaves
# room for it
RESOURCES = PREPARED.resources
if PREPARED.host_memory_mb and "mem_mb" not in workflow.global_resources:
    workflow.register_resource("mem_mb", PREPARED.host_memory_mb)
_HOST_SLOT = any("host" in r for r in (*RESOURCES.values(), PREPARED.calibration_resources))
if _HOST_SLOT and "host" not in workflow.global_resources:
    workflow.register_resource("host", 1)  # the sweep's `alone`: one point at a time on this host
POINTS = {point.point_id: point for point in PREPARED.points}

# the order the points start in (ddlbench.launch.order): every configuration's repetition 0 before any
# repetition 1, each block shuffled, so a host's drift falls on every configuration alike
_SWEEP = getattr(PREPARED.plan, "config", None)
PRIORITIES = run_priorities(
    PREPARED.points, name=_SWEEP.name if _SWEEP else WORKFLOW_KIND, seed=_SWEEP.seed if _SWEEP else 0
)


def point_priority(wildcards):
    return PRIORITIES.get(wildcards.point, 0)


def point_spec(wildcards):
    return POINTS[wildcards.point].to_json()


def point_threads(wildcards):
    point = POINTS[wildcards.point]
    return point.world_size * point.cores_per_rank


def resource_of_point(key):
    def value(wildcards):
        return RESOURCES[wildcards.point][key]

    return value


# the same keys for every point (a Snakemake rule has one set); locally mem_mb or none
POINT_RESOURCES = {key: resource_of_point(key) for key in next(iter(RESOURCES.values()), {})}

# Snakemake takes the signature of each of these functions (inspect.signature) anew at every call, a few
# times per job, which costs a 10,000-point plan about a second (benchmarks/plan_speed.py). It is taken
# once here instead and handed to Snakemake, as Snakemake's own ioutils hand on a wrapped function's.
for _function in (point_spec, point_threads, point_priority, *POINT_RESOURCES.values()):
    overwrite_function_params(_function, get_function_params(_function))
