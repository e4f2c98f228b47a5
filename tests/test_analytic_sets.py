"""The analytic model's benchmark sets (benchmarks/analytic_accuracy.py's SETS): each one is a sweep that
validates and runs, and each scoring set shares no model (on the same input) and no batch size with the sets
made before it
(docs/analytic.md, "Development and scoring sets")."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import REPO

from ddlbench.config import load_sweep_config
from ddlbench.sweep import expand_sweep

HERE = REPO / "benchmarks" / "analytic"


def _benchmark():
    spec = importlib.util.spec_from_file_location("analytic_accuracy", REPO / "benchmarks" / "analytic_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCHMARK = _benchmark()
SETS = dict(BENCHMARK.SETS)


def test_a_calibration_that_lost_a_point_is_not_scored(tmp_path):
    """A machine file whose operators point ran past its limit has no operator fits: the benchmark stops naming
    the point and what to change, where it would have scored the rates' fallback. A precision the device
    refused is no loss."""
    import yaml

    from ddlbench.analysis.machine.machine_file import REFERENCE_MACHINES

    reference = yaml.safe_load(next(iter(sorted(REFERENCE_MACHINES.glob("*.yaml")))).read_text())
    machine = tmp_path / "machine.yaml"
    refused = {"point_id": "compute-bf16", "status": "refused", "reason": "no bf16 on this device"}
    machine.write_text(yaml.safe_dump(reference | {"failed_points": [refused]}))
    BENCHMARK.refuse_incomplete(machine)
    lost = {"point_id": "operators-n1x2-t1-b28cd344", "status": "timeout", "reason": "ran past its limit of 600 s"}
    machine.write_text(yaml.safe_dump(reference | {"failed_points": [refused, lost]}))
    with pytest.raises(SystemExit, match=r"operators-n1x2-t1-b28cd344: timeout .*timeout_s"):
        BENCHMARK.refuse_incomplete(machine)


@pytest.mark.parametrize("name", sorted(SETS))
def test_each_set_is_a_sweep_whose_every_strategy_runs(name):
    plan = expand_sweep(load_sweep_config(HERE / SETS[name]))
    assert plan.points, name
    ran = {point.strategy for point in plan.points}
    assert ran == set(plan.config.strategies), (name, set(plan.config.strategies) - ran)


@pytest.mark.parametrize("name", [name for name in SETS if name.startswith("scoring")])
def test_each_scoring_set_shares_no_model_or_batch_with_the_sets_before_it(name):
    """SETS is in the order the sets were made: a scoring set takes models (each on the input it runs: the
    eighth set's resnet18 on ImageNet-shaped input, where the first ran it on CIFAR-10's) and batch sizes
    that no set before it, and not the calibration's profiled model either, has used; up to the ninth, batch
    sizes none had used too. From the tenth a batch may come again: every even batch from 2 to 26 had been
    used, and a new one would be 28 or more, which the tenth set's models (mobilenet_v2 on 512² images,
    resnet34 on ImageNet) would take 7-15 s a step at on the 2-core machine (their FLOPs at 40 GFLOP/s); a
    configuration is new by its model and input."""
    import yaml

    def pairs(config) -> set[tuple[str, str]]:
        return {(point.model, point.dataset) for point in expand_sweep(config).points}

    names = list(SETS)
    newest = load_sweep_config(HERE / SETS[name])
    before = [load_sweep_config(HERE / SETS[earlier]) for earlier in names[: names.index(name)]]
    suite = yaml.safe_load((HERE / "calibration.yaml").read_text())
    # the calibration's own profiled models, on any input
    profiled = {str(entry["model"]) for entry in suite.get("layer_timings") or []}
    seen_pairs = set().union(*(pairs(config) for config in before))
    seen_batches = set().union(*(set(config.batch_size) for config in before))
    assert not pairs(newest) & seen_pairs
    assert not {model for model, _ in pairs(newest)} & profiled
    if names.index(name) <= names.index("scoring-9"):
        assert not set(newest.batch_size) & seen_batches
