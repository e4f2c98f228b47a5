"""Sweep expansion: a pure function from config to points with stable ids; exclusions; the plan command."""

from __future__ import annotations

import re

from ddlbench.config import sweep_config_from_mapping
from ddlbench.point import POINT_ID_PATTERN, Point
from ddlbench.sweep import expand_sweep
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
    assert make_point(oversubscribe=False).point_id == "resnet8-cifar10-ddp-n1x1-b8-t1-r0-6e60cd86"


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
    assert "4 points, 2 excluded in sweep 'tiny'" in result.stdout
    ids = run_cli("plan", "--configfile", str(path), "--format", "ids").stdout.split()
    assert ids == [p.point_id for p in plan(exclude=[{"nodes": 4}]).points]


def test_default_sweep_ids_survive_the_new_axes():
    """micro_batches, split, strategy options at their defaults and synthetic data stay out of the
    canonical spec, so records measured before those axes existed keep their ids (the id of the first
    point of the default sweep of those days: these settings)."""
    from ddlbench.config import sweep_config_from_mapping

    before = {"name": "default", "models": ["resnet8"], "datasets": ["cifar10"], "strategies": ["ddp"],
              "nodes": [1], "batch_size": [32], "threads": [1], "warmup_steps": 3, "steps": 12, "seed": 0,
              "timeout_s": 300}  # fmt: skip
    ids = [point.point_id for point in expand_sweep(sweep_config_from_mapping(before)).points]
    assert ids[0] == "resnet8-cifar10-ddp-n1x1-b32-t1-r0-c0bee9b8"


def test_axes_a_strategy_ignores_do_not_repeat_its_points():
    result = plan(strategies=["ddp", "gpipe"], nodes=[2], micro_batches=[2, 4], split=[0, 2])
    ddp = [p for p in result.points if p.strategy == "ddp"]
    gpipe = [p for p in result.points if p.strategy == "gpipe"]
    assert len(ddp) == 2 and {(p.micro_batches, p.split) for p in ddp} == {(1, 1)}  # one per model
    assert sorted((p.model, p.micro_batches, p.split) for p in gpipe) == [
        ("resnet20", 2, 2), ("resnet20", 4, 2), ("resnet8", 2, 2), ("resnet8", 4, 2)
    ]  # fmt: skip
    assert all(p.global_batch_size == 32 for p in gpipe)  # one replica: batch_size is the global batch
    assert all(p.global_batch_size == 64 for p in ddp)


def test_hybrid_split_defaults_to_ranks_per_node_and_counts_replicas():
    result = plan(models=["resnet8"], strategies=["dp_pp"], nodes=[2], ranks_per_node=[2], split=[0, 4])
    by_split = {p.split: p for p in result.points}
    assert set(by_split) == {2}  # split 4 on 4 ranks leaves one replica: skipped
    assert by_split[2].replicas == 2 and by_split[2].global_batch_size == 64
    assert "-s2-" in by_split[2].point_id
    (skipped, reason), *_ = result.skipped
    assert skipped.split == 4 and "leaves one replica" in reason


def test_combinations_that_cannot_run_are_skipped_with_a_reason():
    result = plan(
        models=["resnet8", "gpt_tiny"],
        datasets=["cifar10", "tokens_small"],
        strategies=["ddp", "tensor", "interleaved_1f1b"],
        nodes=[1, 2],
        batch_size=[10],
        micro_batches=[5],
    )
    reasons = {(p.model, p.dataset, p.strategy, p.nodes): why for p, why in result.skipped}
    assert "takes tokens input" in reasons[("gpt_tiny", "cifar10", "ddp", 1)]
    assert "splits transformer models; resnet8 is cnn2d" in reasons[("resnet8", "cifar10", "tensor", 2)]
    assert "needs at least 2" in reasons[("gpt_tiny", "tokens_small", "tensor", 1)]
    assert "rounds of" in reasons[("resnet8", "cifar10", "interleaved_1f1b", 2)]
    runnable = {(p.model, p.dataset, p.strategy, p.nodes) for p in result.points}
    assert ("gpt_tiny", "tokens_small", "tensor", 2) in runnable
    assert ("resnet8", "cifar10", "ddp", 2) in runnable
    assert not runnable & set(reasons)


def test_a_changed_strategy_option_changes_the_id_and_a_default_one_does_not():
    default = plan(strategy_options={"ddp": {"bucket_cap_mb": 25}}).points[0]
    assert default.point_id == plan().points[0].point_id
    changed = plan(strategy_options={"ddp": {"bucket_cap_mb": 1}}).points[0]
    assert changed.point_id != default.point_id
    assert changed.resolved_strategy_options() == {"bucket_cap_mb": "1"}
    assert Point.from_dict(changed.to_dict()) == changed


def test_one_f_one_b_needs_as_many_micro_batches_as_stages():
    result = plan(models=["resnet20"], strategies=["1f1b", "gpipe"], nodes=[4], micro_batches=[2])
    assert [p.strategy for p in result.points] == ["gpipe"]
    assert "1F1B needs at least as many micro-batches as stages: 2 < 4" in result.skipped[0][1]


def test_plan_command_lists_skipped_combinations_with_reasons(write_sweep):
    path = write_sweep(models=["resnet8"], datasets=["cifar10"], strategies=["ddp", "gpipe"], nodes=[1, 2])
    result = run_cli("plan", "--configfile", str(path))
    assert result.returncode == 0, result.stderr
    assert "skipped: 1 combinations cannot run" in result.stdout
    assert "gpipe cuts the model over ranks and needs at least 2" in result.stdout
    assert "3 points, 1 skipped in sweep 'tiny'" in result.stdout


def test_each_node_runs_the_single_node_points_once_per_node_and_leaves_the_rest():
    result = plan(each_node=["n1", "gpu-07.cluster"])
    single = [p for p in result.points if p.nodes == 1]
    assert sorted((p.model, p.node) for p in single) == [
        ("resnet20", "gpu-07.cluster"), ("resnet20", "n1"), ("resnet8", "gpu-07.cluster"), ("resnet8", "n1"),
    ]  # fmt: skip
    assert all(p.node == "" for p in result.points if p.nodes > 1)
    ids = [p.point_id for p in result.points]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(POINT_ID_PATTERN, point_id) for point_id in ids)
    assert "-on_gpu_07_cluster-" in next(p.point_id for p in single if p.node == "gpu-07.cluster")
    # without each_node nothing changes: not the points, not the ids, not the config hash
    assert [p.point_id for p in plan().points] == [p.point_id for p in plan(each_node=[]).points]
    assert "each_node" not in sweep_config_from_mapping(BASE).to_dict()


def test_a_node_name_that_could_reach_a_shell_is_refused():
    import pytest

    from ddlbench.errors import ConfigError

    with pytest.raises(ConfigError, match="each_node"):
        plan(each_node=["n1 --exclusive"])


def test_a_local_launch_refuses_a_point_pinned_to_another_host(tmp_path):
    import pytest

    from ddlbench.errors import DdlbenchError
    from ddlbench.launch.runner import run_point

    with pytest.raises(DdlbenchError, match="pinned to node 'elsewhere-42'"):
        run_point(make_point(node="elsewhere-42"), out=tmp_path / "record.json", launcher="local", cores=2)
    assert not (tmp_path / "record.json").exists()
