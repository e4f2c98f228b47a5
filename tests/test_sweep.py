"""Sweep expansion: a pure function from config to points with stable ids; exclusions; the plan command."""

from __future__ import annotations

import re

from ddlbench.config import sweep_config_from_mapping
from ddlbench.sweep import POINT_ID_PATTERN, Point, expand_sweep
from tests.conftest import make_point, run_cli

BASE = {"models": ["resnet8", "resnet20"], "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1, 2, 4]}


def plan(**extra):
    return expand_sweep(sweep_config_from_mapping(BASE | extra))


def test_expansion_is_the_product_of_the_axes_times_repetitions():
    result = plan(batch_size=[16, 32], repetitions=2)
    assert len(result.points) == 2 * 1 * 1 * 3 * 2 * 2
    combos = {(p.model, p.nodes, p.batch_size, p.repetition) for p in result.points}
    assert len(combos) == len(result.points)
    assert {p.nodes for p in result.points} == {1, 2, 4}


def test_expansion_is_deterministic_and_ids_are_unique_and_path_safe():
    first, second = plan(batch_size=[16, 32]), plan(batch_size=[16, 32])
    assert [p.point_id for p in first.points] == [p.point_id for p in second.points]
    ids = [p.point_id for p in first.points]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(POINT_ID_PATTERN, point_id) for point_id in ids)


def test_point_id_is_stable_across_versions():
    """Ids name folders of results already measured: changing the scheme orphans them. Change on purpose only."""
    assert make_point().point_id == "resnet8-cifar10-ddp-n1x1-b8-t1-r0-6e60cd86"


def test_point_id_changes_with_any_setting_but_not_with_axis_order():
    point = make_point()
    assert make_point(steps=4).point_id != point.point_id
    assert make_point(model_options=(("norm", "group"),)).point_id != point.point_id
    reordered = plan(nodes=[4, 2, 1])
    assert {p.point_id for p in reordered.points} == {p.point_id for p in plan().points}


def test_exclude_drops_matching_combinations_only():
    result = plan(exclude=[{"model": "resnet20", "nodes": 4}, {"nodes": 1, "model": "resnet8"}])
    kept = {(p.model, p.nodes) for p in result.points}
    assert kept == {("resnet8", 2), ("resnet8", 4), ("resnet20", 1), ("resnet20", 2)}
    assert {(p.model, p.nodes) for p in result.excluded} == {("resnet20", 4), ("resnet8", 1)}


def test_point_round_trips_through_its_json_spec():
    point = make_point(model_options=(("norm", "group"),))
    import json

    assert Point.from_dict(json.loads(point.to_json())) == point


def test_global_batch_counts_every_data_parallel_rank():
    point = make_point(nodes=2, ranks_per_node=4, batch_size=16)
    assert point.world_size == 8
    assert point.global_batch_size == 128


def test_plan_command_prints_points_and_count(write_sweep):
    path = write_sweep(**BASE, exclude=[{"nodes": 4}])
    result = run_cli("plan", "--configfile", str(path))
    assert result.returncode == 0, result.stderr
    assert "4 points (2 excluded) in sweep 'tiny'" in result.stdout
    ids = run_cli("plan", "--configfile", str(path), "--format", "ids").stdout.split()
    assert ids == [p.point_id for p in plan(exclude=[{"nodes": 4}]).points]
