# ddlbench calibration: one suite = one DAG, its points run like a sweep's (locally or as SLURM jobs).
#   snakemake -s workflow/calibrate.smk --cores 2                              # the default suite
#   snakemake -s workflow/calibrate.smk --cores 2 --configfile my-suite.yaml
#   snakemake -s workflow/calibrate.smk --profile slurm                        # after `ddlbench profile slurm`
# The machine file lands at <results_dir>/<name>/calibration/machine.yaml, its report beside it.
import json
import sys

from ddlbench.calibrate.suite import load_suite
from ddlbench.errors import DdlbenchError
from ddlbench.launch.resources import load_site, snakemake_resources
from ddlbench.launch.submission import plan_resources

# the profile `slurm` passes its site file as config key slurm_site; the rest of config is the suite
SITE_FILE = config.pop("slurm_site", None)
try:
    SUITE = load_suite(raw=dict(config)) if config else load_suite()
    SITE = load_site(SITE_FILE) if SITE_FILE else None
    PLANNED = plan_resources(SUITE.points, SITE) if SITE else {}
except DdlbenchError as error:
    sys.stderr.write(f"ddlbench: invalid calibration suite: {error}\n")
    sys.exit(2)

FOLDER = str(SUITE.folder)
POINTS = {point.point_id: point for point in SUITE.points}
RECORDS = [str(SUITE.record_path(point)) for point in SUITE.points]
SUITE_JSON = json.dumps(SUITE.settings, sort_keys=True)
RESOURCES = {point_id: snakemake_resources(resources) for point_id, resources in PLANNED.items()}


wildcard_constraints:
    point=r"[a-z0-9_]+(?:-[a-z0-9_]+)*",


def point_spec(wildcards):
    return POINTS[wildcards.point].to_json()


def point_threads(wildcards):
    point = POINTS[wildcards.point]
    return point.world_size * point.cores_per_rank


def resource_of_point(key):
    def value(wildcards):
        return RESOURCES[wildcards.point][key]

    return value


rule all:
    input:
        f"{FOLDER}/machine.yaml",


rule calibration_point:
    output:
        record=f"{FOLDER}/points/{{point}}/record.json",
    log:
        f"{FOLDER}/logs/{{point}}.log",
    params:
        spec=point_spec,
    threads: point_threads
    resources:
        **{key: resource_of_point(key) for key in next(iter(RESOURCES.values()), {})},
    conda:
        "../envs/compute.yaml"
    shell:
        "ddlbench run-point --spec {params.spec:q} --out {output.record:q} --cores {threads} > {log:q} 2>&1"


rule machine:
    input:
        RECORDS,
    output:
        machine=f"{FOLDER}/machine.yaml",
        report=f"{FOLDER}/report.html",
    log:
        f"{FOLDER}/logs/machine.log",
    params:
        suite=SUITE_JSON,
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "ddlbench calibrate --config-json {params.suite:q} --from-records --out {output.machine:q} --report {output.report:q} > {log:q} 2>&1"
