"""Predictions against measurements, through the real workflow: a sweep with `calibrate:` measures this
machine first (collectives and layer profiles), predicts every point in the DAG, runs the points, and its
report sets predicted beside measured."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from ddlbench.analysis.analytic.accuracy import by_strategy, join
from tests.conftest import run_snakemake

pytestmark = pytest.mark.slow

STRATEGIES = ["ddp", "zero2", "fsdp", "gpipe", "1f1b"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    root = tmp_path_factory.mktemp("analytic")
    suite = root / "suite.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "name": "cal",
                "results_dir": str(root / "results"),
                "ranks_per_node": 2,
                "matmul_sizes": [256],
                "conv_shapes": [[8, 32, 16, 3]],
                "memory_bytes": 16777216,
                "precisions": ["fp32"],
                "collectives": ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv"],
                "message_bytes": [4096, 65536, 1048576],
                "warmup": 2,
                "iterations": 5,
                "profiles": [{"model": "resnet8", "dataset": "cifar10", "batch_sizes": [4, 8, 16]}],
            }
        )
    )
    sweep = root / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "name": "measured",
                "results_dir": str(root / "results"),
                "models": ["resnet8"],
                "datasets": ["cifar10"],
                "strategies": STRATEGIES,
                "nodes": [1],
                "ranks_per_node": [2],
                "batch_size": [16],
                "micro_batches": [1, 2],
                "threads": [1],
                "warmup_steps": 2,
                "steps": 5,
                "calibrate": str(suite),
                "exclude": [
                    *({"strategy": s, "micro_batches": 2} for s in ("ddp", "zero2", "fsdp")),
                    {"strategy": "gpipe", "micro_batches": 1},
                ],
            }
        )
    )
    result = run_snakemake("--cores", "2", "--configfile", str(sweep))
    assert result.returncode == 0, result.stderr[-3000:]
    folder = root / "results" / "measured"
    return folder, pd.read_parquet(folder / "table.parquet"), pd.read_csv(folder / "predictions.csv")


def test_every_point_is_predicted_from_the_machine_calibrated_first(measured):
    folder, table, predictions = measured
    assert (folder / "machine.yaml").exists()
    assert set(predictions["point_id"]) == set(table["point_id"])
    # the calibration profiled resnet8, so compute comes from the profile, not from FLOP rates
    assert set(predictions["compute_source"]) == {"profile"}
    html = (folder / "report.html").read_text()
    assert "Predicted beside measured" in html
    for strategy in STRATEGIES:
        assert f'<td class="text">{strategy}</td>' in html


def test_memory_is_predicted_within_a_fifth_of_the_measured_peak(measured):
    """The model counts what the allocator holds (ddlbench.train.memory); transient workspaces of single
    kernels are what it leaves out. On resnet20 at batch 32 it was within 11 % for these strategies."""
    _, table, predictions = measured
    rows = {r.strategy: r for r in by_strategy(join(table, predictions))}
    assert set(rows) == set(STRATEGIES)
    for strategy, row in rows.items():
        assert row.memory_worst is not None and row.memory_worst >= 0.8, (strategy, row)


def test_step_time_is_predicted_within_a_factor_three(measured):
    """On 2 shared cores a point's step time moves ±35 % from run to run, and more when anything else runs
    between the calibration and the sweep (a CI run beside other work measured one point at 2.3× its
    prediction), so this asserts the model's order of magnitude only: a unit or a missing term is off by
    far more. benchmarks/analytic_accuracy.py reports its accuracy on a quiet machine."""
    _, table, predictions = measured
    joined = join(table, predictions)
    ratio = joined["predicted_step_time_s"] / joined["step_time_s_median"]
    assert ratio.between(1 / 3, 3.0).all(), joined[["point_id", "step_time_s_median", "predicted_step_time_s"]]
