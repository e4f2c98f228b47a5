"""Every script in benchmarks/ runs at its smallest size and prints its figures, so that none rots.

Each benchmark runs as a user runs it: a subprocess of this interpreter in the repository root, with its
smallest arguments (`--quick`, `--points 100`, one round), writing only under the test's folder. A test
asserts that the script exits 0 and that every figure line it prints is there and parses (a number where a
number is printed, the counts of what was run), never the figures' values: at this size they are timings
of a shared machine and accuracies of a two-point sweep.

What a machine may lack skips with the reason, and fails instead where CI asks for it: the SLURM cluster
(scheduler_load.py; DDLBENCH_REQUIRE_SLURM=1), Chromium (report_screenshot.py; DDLBENCH_REQUIRE_CHROMIUM=1),
Extra-P's environment (empirical_accuracy.py beside Extra-P; DDLBENCH_REQUIRE_EXTRAP=1). A last test
fails when a script of benchmarks/ has no test here.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import find_chromium
from tests.test_extrap_crosscheck import VENV as EXTRAP_VENV
from tests.test_extrap_crosscheck import require_extrap

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
NUMBER = r"-?\d+(?:\.\d+)?"
PERCENT = rf"(?:{NUMBER} %|–)"  # analytic_accuracy prints – for a figure it has no value of
# the scripts each test below runs (bare_ddp.py is overhead.py's baseline, started by it once per rank)
TESTED = {
    "analytic_accuracy.py",
    "bare_ddp.py",
    "certify_summary.py",
    "collective_share.py",
    "empirical_accuracy.py",
    "gpu_probe.py",
    "gpu_analytic.py",  # tested in test_gpu_analytic.py: its CPU smoke run, its rescoring, and on a GPU
    "layer_timing_order.py",
    "overhead.py",
    "packed_wall.py",
    "packing_plan.py",
    "plan_speed.py",
    "report_screenshot.py",
    "report_speed.py",
    "sampling_accuracy.py",
    "scheduler_load.py",
    "update_probe.py",
    "verdict_errors.py",
}  # the two run on the test cluster (scheduler_load.py, packed_wall.py) are in test_slurm_benchmarks.py


def run_benchmark(script: str, *args: str, timeout: float = 600) -> str:
    """Run benchmarks/<script> with `args`; its stdout, after asserting it exited 0."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"},
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def figure(output: str, pattern: str) -> re.Match[str]:
    """The line of `output` that `pattern` matches in full (re.MULTILINE), or a failure naming it."""
    found = re.search(rf"^{pattern}$", output, flags=re.MULTILINE)
    assert found, f"no line matches {pattern!r} in:\n{output[-4000:]}"
    return found


@pytest.mark.slow
def test_plan_speed_plans_its_smallest_sweep_with_both_snakefiles():
    output = run_benchmark("plan_speed.py", "--points", "100", "--repeats", "1")
    assert figure(output, r"(\d+) points, median of 1 run\(s\), wall-clock seconds").group(1) == "100"
    for label in ("expand", "expand+ids", "plan CLI", "snakemake -n", "trivial -n"):
        figure(output, rf"  {re.escape(label)}\s+{NUMBER} s\s+{NUMBER} ms/point")
    figure(
        output,
        rf"  ddlbench Snakefile / trivial Snakefile: {NUMBER}x \(median of 1 alternating rounds' ratios; "
        rf"range {NUMBER}-{NUMBER}; goal <= 1\.3\)",
    )
    figure(output, rf"  ddlbench's extra planning cost: {NUMBER} ms per job")


@pytest.fixture(scope="module")
def report_speed(tmp_path_factory) -> tuple[str, Path]:
    """report_speed.py's quick run: its output, and the folder its sweep was kept in (report included)."""
    kept = tmp_path_factory.mktemp("report-speed") / "sweep"
    return run_benchmark("report_speed.py", "--quick", "--repeats", "1", "--keep", str(kept)), kept


@pytest.mark.slow
def test_report_speed_times_the_finishing_road_of_its_quick_sweep(report_speed):
    output, kept = report_speed
    points = int(figure(output, rf"wrote (\d+) records in {NUMBER} s").group(1))
    assert figure(output, rf"(\d+) points \(records of {NUMBER} kB on average\), median of 1 run\(s\).*").group(
        1
    ) == str(points)
    for label in ("finish", "finish --no-history", "render"):
        figure(output, rf"  {re.escape(label)}\s+{NUMBER} s\s+\(runs: {NUMBER}\)")
    steps = figure(output, r"  \(the finish's steps, one run in-process without history: (.*) s\)").group(1)
    assert [step.split()[0] for step in steps.split(", ")] == ["table", "models", "predictions", "history", "report"]
    assert int(figure(output, rf"  models.json {NUMBER} MB, (\d+) models").group(1)) > 0
    figure(output, rf"  report.html\s+{NUMBER} MB")
    assert len(list((kept / "points").glob("*/record.json"))) == points
    assert (kept / "report.html").stat().st_size > 0


@pytest.mark.slow
def test_report_screenshot_shoots_a_report(report_speed, tmp_path):
    if find_chromium() is None:
        if os.environ.get("DDLBENCH_REQUIRE_CHROMIUM") == "1":
            pytest.fail("DDLBENCH_REQUIRE_CHROMIUM=1 but no Chromium: apt-get install chromium-headless-shell")
        pytest.skip("no Chromium installed (apt-get install chromium-headless-shell)")
    _, kept = report_speed
    shot = tmp_path / "shot.png"
    output = run_benchmark("report_screenshot.py", str(kept / "report.html"), "--out", str(shot), "--max-height", "600")
    width, height = figure(output, rf"{re.escape(str(shot))}: (\d+)×(\d+) px, {NUMBER} kB").groups()
    assert int(width) == 1200 and 0 < int(height) <= 600  # the default width, at most --max-height
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _accuracy_summaries(output: str, methods: tuple[str, ...]) -> None:
    figure(output, r"(\d+) public series \(benchmarks/empirical/data/sources.yaml\), two largest scales held out")
    for position in (r"first held out \(2×\)", r"second held out \(4×\)"):
        line = figure(output, rf"{position}\s+.*target ≥ {NUMBER} %").group(0)
        for method in methods:
            assert re.search(rf"{re.escape(method)}: mean {NUMBER} % \(median {NUMBER} %\)", line), (method, line)
    figure(output, r"ddlbench's 95 % prediction intervals hold \d+ of \d+ held-out measurements .*")


@pytest.mark.slow
def test_empirical_accuracy_scores_ddlbench_s_searches():
    output = run_benchmark("empirical_accuracy.py", "--no-extrap")
    _accuracy_summaries(output, ("ddlbench", "ddlbench-pmnf", "extrap (ours)"))
    assert "Extra-P 4.2.5" not in output


def test_empirical_accuracy_scores_the_frozen_set_against_extra_p_paired_by_series():
    output = run_benchmark("empirical_accuracy.py", "--set", "scoring", "--no-extrap")
    count = int(figure(output, r"(\d+) public series \(benchmarks/empirical/scoring/sources.yaml\).*").group(1))
    assert "chosen out of sample" not in output  # scored only: no selection runs on the scoring set
    # the per-series table: ddlbench's and Extra-P's (ours) accuracies at 2× and 4×, to 0.1 point
    # (an accuracy is negative where a prediction is off by more than the measurement)
    rows = [re.findall(r"(-?\d+\.\d)/\s*(-?\d+\.\d)", line) for line in output.splitlines() if "(4×)" in line]
    rows = [row for row in rows if len(row) == 4]  # ddlbench, amdahl, ddlbench-pmnf, extrap (ours)
    assert len(rows) == count
    signed = r"[-+]?\d+(?:\.\d+)?"
    for position, label in ((0, "2×"), (1, "4×")):
        mean, low, high = (
            float(g)
            for g in figure(
                output,
                rf"  {label}: default .*; difference ({signed}) points, 95 % interval \[({signed}), ({signed})\] \(t.*",
            ).groups()
        )
        # the paired difference is the mean of the series' own differences (each printed to ±0.05)
        paired = statistics.fmean(float(row[0][position]) - float(row[3][position]) for row in rows)
        assert mean == pytest.approx(paired, abs=0.1) and low <= mean <= high


@pytest.mark.slow
def test_empirical_accuracy_scores_extra_p_beside_them():
    require_extrap(EXTRAP_VENV, dict(os.environ))
    output = run_benchmark("empirical_accuracy.py", "--extrap-venv", str(EXTRAP_VENV))
    _accuracy_summaries(output, ("ddlbench", "extrap (ours)", "Extra-P 4.2.5"))
    same, series = figure(
        output, r"extrap \(ours\) predicts what Extra-P 4.2.5 predicts on (\d+) of (\d+) series"
    ).groups()
    assert int(same) <= int(series)


@pytest.mark.slow
def test_analytic_accuracy_calibrates_runs_and_scores_its_quick_sweep(tmp_path):
    output = run_benchmark("analytic_accuracy.py", "--quick", "--results-dir", str(tmp_path))
    measured = figure(output, r"machine .*; (\d+) measured points with predictions \((\d+) not ok\)(, .*)?").groups()[
        :2
    ]
    assert measured == ("2", "0")
    for strategy in ("ddp", "gpipe"):
        figure(output, rf"{strategy}\s+1\s+{PERCENT}\s+{PERCENT}\s+{PERCENT}\s+{PERCENT}")
    figure(output, rf"average over strategies: time {NUMBER} % \(target ≥ 92 %\), memory {NUMBER} % \(target ≥ 90 %\)")
    figure(output, rf"data parallelism \(ddp\): time {NUMBER} % \(target ≥ 97 %\)")
    # one cell (ddp and gpipe on 1 node × 2 ranks), one launch each: a hit only if the pick is the best
    hits = figure(output, r"recommendation: the measured best or within its interval in ([01]) of 1 cells \(.*")
    summary = json.loads((tmp_path / "bench_analytic_quick" / "accuracy.json").read_text())
    assert {row["strategy"] for row in summary["by_strategy"]} == {"ddp", "gpipe"}
    # the calibration repeated after the sweep: its score, and its operator times against the first's
    figure(output, rf"the same configurations predicted from a second calibration, .*: time {PERCENT} averaged .*")
    ratios = figure(output, rf"its operator times ÷ the first calibration's, .*: 2 rank\(s\) ×({NUMBER})")
    ratio = float(ratios.group(1))
    assert summary["second_calibration"]["operator_ratio"] == {"2": pytest.approx(ratio, abs=0.006)}
    assert (tmp_path / "bench_analytic_quick" / "machine-after.yaml").exists()
    # the same configurations from the machine file rescaled by the sweep's host probes against the calibration's
    figure(
        output,
        rf"with the host's drift taken out .*: time {PERCENT} averaged over strategies \(n = 2 configurations\).*",
    )
    speed = figure(output, rf"host speed during the sweep ÷ during the calibration .*: compute median ×({NUMBER}) .*")
    assert summary["host_adjusted"]["configurations"] == 2
    operators = [s["operators"]["compute"] for s in summary["host_adjusted"]["speeds"]]
    assert float(speed.group(1)) == pytest.approx(sorted(operators)[len(operators) // 2], abs=0.006)
    (cell,) = summary["recommendation"]["per_cell"]
    assert cell["hit"] == (cell["recommended"] == cell["measured_best"]) == (hits.group(1) == "1")


@pytest.mark.slow
def test_sampling_accuracy_compares_its_quick_sweeps(tmp_path):
    output = run_benchmark("sampling_accuracy.py", "--quick", "--trials", "1", "--results-dir", str(tmp_path))
    assert figure(output, rf"full sweep: (\d+) runs, {NUMBER} node-s \(measured\)").group(1) == "4"
    runs = int(
        figure(
            output,
            rf"adaptive:\s+(\d+) runs in \d+ launches over \d+ rounds, {NUMBER} node-s \(measured: .*\)",
        ).group(1)
    )
    assert 1 <= runs <= 4
    figure(output, rf"saved: {NUMBER} % of the profiling cost")
    figure(output, r"over 1 adaptive sweep\(s\) \(medians; the range in brackets\):")
    figure(output, r"rounds after round 0 that measured points: \d+ \(\d+–\d+\)")
    figure(output, rf"saved: {NUMBER} % \({NUMBER}–{NUMBER} %\), target ≥ 90 %")
    if runs < 4:  # a configuration left to the model: its prediction is scored, by both searches
        for method in ("ddlbench", "extrap"):
            figure(output, rf"accuracy lost, {method}\s*: {NUMBER} points \({NUMBER} to {NUMBER}\), target ≤ 2")


@pytest.mark.slow
def test_gpu_probe_says_it_needs_a_gpu_and_overhead_refuses_sides_without_bare():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    probe = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_probe.py")], capture_output=True, text=True, env=env)
    assert probe.returncode == 1 and "needs a CUDA GPU" in probe.stderr
    for sides, why in (("ddlbench,traced", "bare and one or both"), ("traced,bare", "name ddlbench")):
        bad = subprocess.run(
            [sys.executable, str(BENCHMARKS / "overhead.py"), "--sides", sides], capture_output=True, text=True
        )
        assert bad.returncode == 2 and why in bad.stderr, bad.stderr


def test_overhead_runs_ddlbench_and_the_bare_loop_on_the_same_job():
    output = run_benchmark("overhead.py", "--pairs", "1", "--steps", "2", "--warmup", "2", "--batch", "4")
    figure(output, r"allocator: fixed \(GLIBC_TUNABLES='.*glibc\.malloc\.mmap_threshold=\d+.*'\)")
    losses = {}
    for side in ("ddlbench", "traced", "bare"):
        found = figure(
            output,
            rf"round  1  {side}\s+{NUMBER} samples/s  window\s+{NUMBER} s  launch→end\s+{NUMBER} s  "
            rf"loss ({NUMBER})→({NUMBER})  .*",
        )
        losses[side] = (float(found.group(1)), float(found.group(2)))
        figure(output, rf"  {side}\s+median\s+{NUMBER} samples/s   no CI \(n = 1 ≤ 5\)   range {NUMBER}–{NUMBER}")
    for side, base in (("ddlbench", "bare"), ("traced", "bare"), ("traced", "ddlbench")):
        figure(output, rf"  {side}/{base}: ratio of medians {NUMBER}.*; per-round ratios median {NUMBER}, range .*")
    # the same model, batches and optimizer on both sides: the same losses (printed to 4 decimals)
    assert losses["ddlbench"] == losses["traced"] == losses["bare"], losses


def test_scheduler_load_simulates_its_smallest_sweep_beside_the_baseline():
    output = run_benchmark("scheduler_load.py", "--simulate", "100", "--repeats", "1")
    figure(output, r"simulated sweep: 100 points, records written in .*; baseline \w+")
    for way in ("submit", "watch"):
        for code in ("baseline", "today"):
            figure(output, rf"{way}\s+{code}(?:\s+{NUMBER}){{6}}")
        figure(
            output,
            rf"{way}: steady state {NUMBER} scheduler calls/min \(baseline {NUMBER}; target <= 2\), {NUMBER} fs ops "
            rf"per point per minute \(baseline {NUMBER}; target <= 1; {NUMBER}x fewer\)",
        )
    for label in ("baseline look", "today cold look", "today warm look", "status CLI warm", "planning alone"):
        figure(output, rf"  {label}\s+{NUMBER} s")
    figure(output, rf"  today's look / baseline's: cold {NUMBER}, warm {NUMBER} \(target: a look under 1 s\)")


def test_scheduler_load_checks_out_the_baselines_code_for_the_cluster_roads(tmp_path):
    """The cluster mode's baseline side (left out of the cluster test for time): BASELINE's package and
    Snakefile checked out as a git worktree (removed again here, as the benchmark prunes its own)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("scheduler_load", REPO / "benchmarks" / "scheduler_load.py")
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as patch:  # its dataclasses look their module up while being made
        patch.setitem(sys.modules, spec.name, module)
        spec.loader.exec_module(module)
    tree = module.baseline_tree(tmp_path / "baseline-tree")
    try:
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        assert head.stdout.startswith(module.BASELINE), head.stdout
        assert (tree / "Snakefile").is_file() and (tree / "ddlbench" / "__init__.py").is_file()
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=True)


def test_packing_plan_plans_its_sweep_in_allocations_of_each_width():
    output = run_benchmark("packing_plan.py", "--repetitions", "1", "--widths", "64,1000")
    figure(output, r"sweep: 2016 points, \d+ node-hours expected; partition: 1000 nodes, MaxTime 24 h")
    for width in (64, 1000):
        row = figure(
            output,
            rf"\s*{width}\s+(\d+)\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+({NUMBER})%\s+({NUMBER})\s+{NUMBER}%\s+(?:{NUMBER}%|-)",
        )
        assert int(row.group(1)) >= 1 and 0 <= float(row.group(2)) < 100 and float(row.group(3)) >= 1.0, row.group(0)


def test_certify_summary_sets_a_gpus_figures_beside_its_card_and_prints_findings(tmp_path):
    from ddlbench.certify.certificate import build_certificate
    from ddlbench.history.figures import Figure

    def measured(name: str, value: float, **extra) -> Figure:
        fields = dict(unit="FLOP/s", kind="machine", value=value, ci_low=None, ci_high=None, n=9, basis="b") | extra
        return Figure(name=name, **fields)

    figures = [
        measured("quick/matmul_flop_per_s/bf16/cuda:0", 700e12),
        measured("health/cuda:0", 1, unit="findings", kind="health", check="failed", finding="XID 79 during the load"),
    ]
    certificate = build_certificate(
        figures, None, system="s", partition="p", suite="quick", config_hash="q", references_path=None,
        device_name="NVIDIA H200",
    )  # fmt: skip
    (tmp_path / "c.json").write_text(json.dumps(certificate))
    output = run_benchmark("certify_summary.py", str(tmp_path / "c.json"))
    assert "card NVIDIA H200 141GB" in output
    # 700 TFLOP/s against the datasheet's 989.4 and the inferred achievable 794.5 (ddlbench/certify/cards.yaml)
    figure(
        output,
        r"\s+quick/matmul_flop_per_s/bf16/cuda:0\s+7e\+14 FLOP/s n=9 no reference"
        r" = 70\.7 % of peak, 88\.1 % of achievable",
    )
    figure(output, r"\s+health/cuda:0\s+1 findings n=9 failed  XID 79 during the load")


def test_verdict_errors_prints_false_alarm_rates_and_power_for_every_size():
    output = run_benchmark("verdict_errors.py", "--draws", "20")
    for k in (2, 3, 5, 10):
        for n in (3, 6, 10):
            row = figure(output, rf"\s*{k}\s+{n}\s+({NUMBER}) % \[.*\]\s+({NUMBER}) % \[.*\]\s+({NUMBER}) % .*")
            assert all(0 <= float(row.group(i)) <= 100 for i in (1, 2, 3))
    figure(output, rf"largest false-alarm rate: {NUMBER} % \(alpha 5 %\): (within|ABOVE) alpha; \d+ s")


def test_collective_share_prints_each_sizes_cost_and_share_from_two_real_ranks():
    """Two real gloo ranks of this host: each size's line holds the reduce-scatter alone (ms, and ns/B of the
    size), the CPU its rank burned meanwhile, the compute's stretch beside it and its share of the collective,
    and both ends against the serial sum, each figure the one its neighbours imply."""
    output = run_benchmark(
        "collective_share.py", "--sizes-mib", "1", "2", "--rounds", "3", "--work", "pass", "--op", "reduce_scatter"
    )
    assert "gloo reduce_scatter, 2 ranks of this host" in output
    for size in (1, 2):
        line = figure(
            output,
            rf"\s*{size} MiB  alone\s+({NUMBER}) ms\s+({NUMBER}) ns/B cpu\s+({NUMBER})   beside pass of\s+({NUMBER}) "
            rf"ms: stretched\s+\+?({NUMBER}) ms, share\s+({NUMBER}); both done\s+({NUMBER}) ms, serial\s+"
            rf"({NUMBER}) ms \(×({NUMBER})\); over the 3 rounds: alone ({NUMBER})-({NUMBER}) ms, "
            rf"both ÷ serial ({NUMBER})-({NUMBER})",
        )
        alone, per_byte, _cpu, compute, stretch, share, both, serial, ratio, *ranges = (float(v) for v in line.groups())
        low, high, ratio_low, ratio_high = ranges
        assert low - 0.05 <= alone <= high + 0.05 and ratio_low <= ratio_high
        assert alone > 0 and compute > 0 and both > 0
        # printed to 0.1 ms and two decimals: each figure within its neighbours' rounding
        assert per_byte == pytest.approx(alone * 1e6 / (size * 2**20), abs=0.01 + 0.05e6 / (size * 2**20))
        assert serial == pytest.approx(compute + alone, abs=0.15)
        # both and serial are each within 0.05 ms of their values: the quotient moves by up to
        # 0.05 (1 + both/serial) / serial, however far beyond 1 it is
        assert ratio == pytest.approx(both / serial, abs=0.005 + 0.05 * (1 + both / serial) / (serial - 0.05))
        assert share == pytest.approx(stretch / alone, abs=0.005 + 0.05 * (1 + abs(stretch)) / alone**2 + 0.05 / alone)
    figure(output, r"done in \d+ s")


def test_every_benchmark_script_has_a_test_here():
    scripts = {path.name for path in BENCHMARKS.glob("*.py")}
    assert scripts == TESTED, f"benchmarks without a test: {sorted(scripts - TESTED)}; gone: {sorted(TESTED - scripts)}"


@pytest.mark.slow
def test_update_probe_prints_the_probe_each_way_and_each_models_step():
    output = run_benchmark("update_probe.py", "--models", "resnet8", "--dataset", "cifar10", "--rounds", "1",
                           "--probe-mib", "4")  # fmt: skip
    line = rf"{NUMBER} ns/element \(median of (\d+), range {NUMBER}-{NUMBER}; ×{NUMBER} the warm probe\) {NUMBER} M "
    assert figure(output, rf"probe warm +{line}elements").group(1) == "3"
    assert figure(output, rf"probe cold +{line}elements").group(1) == "3"
    assert figure(output, rf"resnet8 +{line}parameters").group(1) == "2"


@pytest.mark.serial  # its ratio of two timed batches held below 1 alone, not beside three workers (1.132, a CI run)
def test_layer_timing_order_prints_each_kinds_ratio_and_spread():
    output = run_benchmark("layer_timing_order.py", "--batches", "4", "2", "--calibrations", "2", "--iterations", "3",
                           "--warmup", "1")  # fmt: skip
    assert figure(output, r"R = median step at batch 2 ÷ at batch 4, one per calibration; spread = exp\(sd of log R\)")
    ratios = {}
    for kind in ("quiet, in rounds", "spells, in rounds", "spells, one after other"):
        line = rf"{kind} +R median ({NUMBER}) \(range {NUMBER}-{NUMBER} over 2\), spread ×{NUMBER}"
        ratios[kind] = float(figure(output, line).group(1))
    # half the samples take less time than twice as many (timed in rounds, load from elsewhere weighs on both
    # alike; one after the other, a spell during the smaller batch alone can take it past 1)
    assert 0 < ratios["quiet, in rounds"] < 1, ratios
    figure(output, rf"spread of log R, one after other ÷ in rounds: ×(?:{NUMBER}|inf)")
