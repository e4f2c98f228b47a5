"""The benchmarks that run on the test cluster, each at its smallest size (tests/test_benchmarks.py runs
the others): in a test_slurm_* module, so `make test` runs them in the SLURM tests' group, one after
another with the other cluster tests (tests/conftest.py)."""

from __future__ import annotations

import re

import pytest

from tests.slurm_support import require_cluster
from tests.test_benchmarks import NUMBER, figure, run_benchmark


@pytest.mark.slow
@pytest.mark.slurm
def test_scheduler_load_counts_the_scheduler_calls_of_a_two_point_sweep():
    require_cluster()
    # today's code only: the baseline's two roads doubled the test (115 s) for code that does not change;
    # its checkout is tested without the cluster (test_benchmarks.py), its figures by running the benchmark
    output = run_benchmark("scheduler_load.py", "--points", "2", "--no-baseline", timeout=900)
    figure(output, r"scheduler calls for a 2-point sweep .*; baseline: \w+")
    roads = ("snakemake --profile slurm", "ddlbench submit (submitit arrays)")
    assert "(baseline)" not in output, output
    for label in (f"{road} (today)" for road in roads):
        counts = figure(output, rf"{re.escape(label)}\s+{NUMBER}((?:\s+\d+ \[\s*\d+\]){{7}})").group(1)
        assert int(re.findall(r"(\d+) \[", counts)[0]) >= 1, f"{label} called sbatch no time: {counts}"
        per_point = rf"{re.escape(label)}: per point on the login node \{{.*'sbatch': {NUMBER}.*\}}"
        figure(output, rf"{per_point}; records \{{'ok': 2\}}")  # every point ran
        rates = figure(
            output,
            rf"{re.escape(label)}: ({NUMBER}) status queries and ({NUMBER}) scheduler calls per point per minute "
            rf"\(2 points in {NUMBER} min; target <= 0\.05\); {NUMBER} login-node scheduler calls a minute for the "
            rf"whole sweep",
        )
        assert 0 < float(rates.group(1)) <= float(rates.group(2)), rates.group(0)
        # the checks meant for the login node (partitions, nodes, limits) are not made again inside a job
        inside = figure(output, rf"{re.escape(label)}: inside the jobs (\{{.*\}})").group(1)
        assert "show partition" not in inside and "show node" not in inside and "sacctmgr" not in inside, inside


@pytest.mark.slow
@pytest.mark.slurm
def test_packed_wall_runs_one_sweep_both_ways():
    require_cluster()
    output = run_benchmark("packed_wall.py", "--points", "2", "--rounds", "1", timeout=900)
    for way, jobs in (("per_point", 2), ("packed", 1)):
        figure(
            output,
            rf"round 0 {way}\s+{NUMBER} s wall, {jobs} SLURM job\(s\) holding \d+ node-s: 2 points \{{'ok': 2\}}.*",
        )
    figure(output, rf"median wall s over 1 round\(s\) of 2 points: per point {NUMBER}, packed {NUMBER}; .*")
