# ddlbench's adaptive sweep (sparse sampling): a checkpoint loop over rounds instead of every point.
#   snakemake -s workflow/adaptive.smk --cores 2 --configfile my-sweep.yaml   # its `adaptive:` key
#   snakemake -s workflow/adaptive.smk --profile slurm --configfile my-sweep.yaml  # points as SLURM jobs
# Round N (checkpoint choose_round) reads the records of rounds < N, models them and writes which short
# runs to measure next, or why to stop (ddlbench.sampling.plan); the records are measured; the loop goes
# on until a round stops; then the summary: cost, savings and the models (ddlbench.sampling.summary).
# Everything lands in <results_dir>/<name>/adaptive/.
import dataclasses
import json
import os
import sys

from ddlbench.errors import DdlbenchError
from ddlbench.launch.resources import load_site
from ddlbench.launch.submission import point_resources
from ddlbench.point import POINT_ID_PATTERN, Point
from ddlbench.sampling.settings import adaptive_settings
from ddlbench.sweep import plan_sweep

# `--profile slurm` names its site file: each sampled point is then a SLURM job with the allocation
# its configuration gets in the full sweep (same layout, same time limit)
SITE_FILE = config.pop("slurm_site", None)
if not config:

    configfile: "workflow/config/default.yaml"

    config.pop("slurm_site", None)


try:
    PLAN = plan_sweep(config)
    SETTINGS = adaptive_settings(PLAN.config.to_dict()["adaptive"])
    SITE = load_site(SITE_FILE) if SITE_FILE else None
    RESOURCES = point_resources(PLAN, SITE) if SITE else {}
except DdlbenchError as error:
    sys.stderr.write(f"ddlbench: invalid sweep config: {error}\n")
    sys.exit(2)

# a sampled point's allocation is its configuration's: found by everything but steps and repetition
BY_CONFIGURATION = {
    dataclasses.replace(point, steps=0, warmup_steps=0, repetition=0): RESOURCES[point.point_id]
    for point in PLAN.points
    if point.point_id in RESOURCES
}

FOLDER = f"{PLAN.config.sweep_dir}/adaptive"
CONFIG_JSON = json.dumps(PLAN.config.to_dict(), sort_keys=True)


wildcard_constraints:
    round=r"\d+",
    point=POINT_ID_PATTERN,


def round_file(number):
    return f"{FOLDER}/rounds/{number}.json"


def chosen(path):
    with open(path) as handle:
        return json.load(handle)


def records_of(path):
    return [f"{FOLDER}/points/{Point.from_dict(spec).point_id}/record.json" for spec in chosen(path)["points"]]


def previous_round(wildcards):
    """Round N needs round N−1 (a checkpoint: its points are known only once it ran) and its records."""
    number = int(wildcards.round)
    if number == 0:
        return []
    path = checkpoints.choose_round.get(round=str(number - 1)).output.plan
    return [path, *records_of(path)]


def every_round(wildcards):
    inputs = []
    number = 0
    while True:
        path = checkpoints.choose_round.get(round=str(number)).output.plan
        inputs += [path, *records_of(path)]
        if chosen(path)["stop"]:
            return inputs
        number += 1


def sampled(wildcards):
    """The sampled point of this id, from the round files written so far."""
    number = 0
    while os.path.exists(round_file(number)):
        for spec in chosen(round_file(number))["points"]:
            if Point.from_dict(spec).point_id == wildcards.point:
                return Point.from_dict(spec)
        number += 1
    raise ValueError(f"point {wildcards.point} is in no round of {FOLDER}/rounds")


def sampled_spec(wildcards):
    return sampled(wildcards).to_json()


def sampled_threads(wildcards):
    point = sampled(wildcards)
    return point.world_size * point.cores_per_rank


def sampled_resource(key):
    def value(wildcards):
        point = sampled(wildcards)
        return BY_CONFIGURATION[dataclasses.replace(point, steps=0, warmup_steps=0, repetition=0)][key]

    return value


rule all:
    input:
        f"{FOLDER}/sampling.json",


checkpoint choose_round:
    input:
        previous_round,
    output:
        plan=f"{FOLDER}/rounds/{{round}}.json",
    log:
        f"{FOLDER}/logs/round_{{round}}.log",
    params:
        sweep=CONFIG_JSON,
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "ddlbench sample --config-json {params.sweep:q} --round {wildcards.round} --out {output.plan:q} > {log:q} 2>&1"


rule sampled_point:
    output:
        record=f"{FOLDER}/points/{{point}}/record.json",
    log:
        f"{FOLDER}/logs/{{point}}.log",
    params:
        spec=sampled_spec,
    threads: sampled_threads
    resources:
        **{key: sampled_resource(key) for key in next(iter(RESOURCES.values()), {})},
    conda:
        "../envs/compute.yaml"
    shell:
        "ddlbench run-point --spec {params.spec:q} --out {output.record:q} --cores {threads} > {log:q} 2>&1"


rule summary:
    input:
        every_round,
    output:
        summary=f"{FOLDER}/sampling.json",
    log:
        f"{FOLDER}/logs/summary.log",
    params:
        sweep=CONFIG_JSON,
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "ddlbench sample --config-json {params.sweep:q} --summarize --out {output.summary:q} > {log:q} 2>&1"
