# The adaptive sweep's rounds (workflow/adaptive.smk): which round file holds a launch of sampled points,
# what each round needs, and a launch's allocation (its points' configuration's in the full sweep, with
# their time limits added up).
import dataclasses
import json

from ddlbench.point import Point

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
    launch=r"r\d+-l\d+",


def round_file(number):
    return f"{FOLDER}/rounds/{number}.json"


def chosen(path):
    with open(path) as handle:
        return json.load(handle)


def launches_of(path):
    return [f"{FOLDER}/launches/{launch['id']}.json" for launch in chosen(path)["launches"]]


def previous_round(wildcards):
    """Round N needs round N−1 (a checkpoint: its points are known only once it ran) and its launches."""
    number = int(wildcards.round)
    if number == 0:
        return []
    path = checkpoints.choose_round.get(round=str(number - 1)).output.plan
    return [path, *launches_of(path)]


def every_round(wildcards):
    inputs = []
    number = 0
    while True:
        path = checkpoints.choose_round.get(round=str(number)).output.plan
        inputs += [path, *launches_of(path)]
        if chosen(path)["stop"]:
            return inputs
        number += 1


def launched(wildcards):
    """The sampled points of this launch, from the round file that lists it."""
    path = round_file(int(wildcards.launch[1:].split("-")[0]))
    entry = chosen(path)
    ids = next(launch["points"] for launch in entry["launches"] if launch["id"] == wildcards.launch)
    by_id = {Point.from_dict(spec).point_id: Point.from_dict(spec) for spec in entry["points"]}
    return [by_id[point_id] for point_id in ids]


def launch_specs(wildcards):
    return json.dumps([point.to_dict() for point in launched(wildcards)], sort_keys=True)


def launch_threads(wildcards):
    point = launched(wildcards)[0]
    return point.world_size * point.cores_per_rank


def _configuration(point):
    return BY_CONFIGURATION[dataclasses.replace(point, steps=0, warmup_steps=0, repetition=0)]


def launch_resource(key):
    """The first point's configuration's value; the time limit is the points' limits added up."""

    def value(wildcards):
        points = launched(wildcards)
        if key == "runtime":
            return sum(_configuration(point)[key] for point in points)
        return _configuration(points[0])[key]

    return value


# the same keys for every launch (a Snakemake rule has one set); none when running locally
LAUNCH_RESOURCES = {key: launch_resource(key) for key in next(iter(RESOURCES.values()), {})}
