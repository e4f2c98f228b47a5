# ddlbench calibration: one suite = one DAG, its points run like a sweep's (locally or as SLURM jobs).
#   snakemake -s workflow/calibrate.smk --cores 2                              # the default suite
#   snakemake -s workflow/calibrate.smk --cores 2 --configfile my-suite.yaml
#   snakemake -s workflow/calibrate.smk --profile slurm                        # after `ddlbench profile slurm`
# The machine file lands at <results_dir>/<name>/calibration/machine.yaml, its report beside it.
import json

# The preamble (rules/preamble.smk) validates the suite (--configfile, else the package's default) and
# makes the checks every workflow makes before anything is scheduled.
WORKFLOW_KIND = "calibration"


include: "rules/preamble.smk"


SUITE = PREPARED.suite
FOLDER = str(SUITE.folder)
RECORDS = [str(SUITE.record_path(point)) for point in SUITE.points]
SUITE_JSON = json.dumps(SUITE.settings, sort_keys=True)


wildcard_constraints:
    point=r"[a-z0-9_]+(?:-[a-z0-9_]+)*",


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
        **POINT_RESOURCES,
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
