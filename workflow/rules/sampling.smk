# The adaptive sweep's rounds (workflow/adaptive.smk): which round file holds a sampled point, what each
# round needs, and a sampled point's allocation (its configuration's in the full sweep).
import dataclasses
import json
import os

from ddlbench.point import POINT_ID_PATTERN, Point

PLAN = PREPARED.plan

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


# the same keys for every sampled point (a Snakemake rule has one set); none when running locally
SAMPLED_RESOURCES = {key: sampled_resource(key) for key in next(iter(RESOURCES.values()), {})}
