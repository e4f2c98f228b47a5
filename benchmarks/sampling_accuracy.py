"""Sparse sampling against the full sweep, both measured here: profiling cost saved, accuracy lost.

    python benchmarks/sampling_accuracy.py            # both sweeps, 5 adaptive trials (about 13 min on 2 cores)
    python benchmarks/sampling_accuracy.py --reuse    # recompute from the records already there
    python benchmarks/sampling_accuracy.py --reuse-full --trials 5   # only the adaptive sweep, 5 times
    python benchmarks/sampling_accuracy.py --quick --trials 1 --results-dir /tmp/s   # CI's size: seconds

1. Snakemake runs benchmarks/sampling/sweep.yaml in full: every configuration, every repetition, each
   point a launch of its own;
2. Snakemake runs workflow/adaptive.smk on the same file: short runs of a few configurations, round by
   round, several per launch, until the band target, the budget or the rounds run out (ddlbench.sampling);
3. prints, from the records:
   - cost (node-seconds, nodes × launch wall time, measured: the full sweep's points, the adaptive sweep's
     launches, round 0's included) of each, and saved = 1 − adaptive / full; how many rounds after round 0
     measured points (an adaptive sweep that never adapts shows 0);
   - at every configuration the adaptive sweep did not measure, the accuracy of its model's prediction
     against the full sweep's median over repetitions, 1 − |predicted − measured| / measured, for
     ddlbench's default search and, beside it, Extra-P's search fitted on the same sampled points;
   - the full sweep's own repeatability there, the mean over its repetitions of 1 − |rep − median| /
     median (what one more measurement would score: the floor no prediction can beat);
   - accuracy lost = repeatability − prediction accuracy, in points; issue 22's targets: ≥ 90 % of the
     cost saved at ≤ 2 points lost, medians over at least 5 trials.
Both sweeps run one point (one launch) at a time (`--cores 1`): two 1-thread points side by side on a
2-core host slow each other (the full sweep's medians came out 10–30 % above the same configurations
timed alone), and the full sweep is the reference. Nothing else should run meanwhile.

--quick runs benchmarks/sampling/quick_sweep.yaml instead (four batch sizes, one launch each; the adaptive
sweep measures three): the same steps and printout in seconds, to show the benchmark still runs; its
figures say nothing. --results-dir puts both sweeps under another folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddlbench.config import sweep_config_from_mapping  # noqa: E402
from ddlbench.launches import read_launch  # noqa: E402
from ddlbench.records import read_record  # noqa: E402
from ddlbench.sampling.costs import spent_node_s  # noqa: E402

SWEEP = REPO / "benchmarks" / "sampling" / "sweep.yaml"
QUICK_SWEEP = REPO / "benchmarks" / "sampling" / "quick_sweep.yaml"


def run(*command: str) -> None:
    print("$", " ".join(command), flush=True)
    # the workflow's rules call `ddlbench`: this interpreter's, whether or not its venv is active
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    subprocess.run(command, check=True, cwd=REPO, env={**os.environ, "PATH": path})


def node_seconds(record) -> float:
    """Nodes × the record's wall time from its provenance (start to end), node-seconds."""
    start = datetime.fromisoformat(record.provenance.start_time)
    end = datetime.fromisoformat(record.provenance.end_time)
    return record.point.nodes * max(0.0, (end - start).total_seconds())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse", action="store_true", help="use the records already measured")
    parser.add_argument("--reuse-full", action="store_true", help="run the adaptive sweep again, not the full one")
    parser.add_argument(
        "--trials", type=int, default=5, help="independent adaptive sweeps against the one full sweep (default 5)"
    )
    parser.add_argument("--quick", action="store_true", help="benchmarks/sampling/quick_sweep.yaml (CI's size)")
    parser.add_argument("--results-dir", type=Path, help="write under this folder instead of the file's results_dir")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error(f"--trials {args.trials}: must be at least 1")
    sweep_file = QUICK_SWEEP if args.quick else SWEEP
    raw = yaml.safe_load(sweep_file.read_text())
    if args.results_dir is not None:
        raw["results_dir"] = str(args.results_dir.resolve())
    config = sweep_config_from_mapping(raw)
    sweep_dir = REPO / config.sweep_dir
    if args.results_dir is not None:  # the sweep as run, kept beside its results
        sweep_dir.mkdir(parents=True, exist_ok=True)
        sweep_file = sweep_dir / "sweep-run.yaml"
        sweep_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    if not args.reuse and not args.reuse_full:
        run(snakemake, "--cores", "1", "--configfile", str(sweep_file), "--forceall")
    full = [read_record(p) for p in sorted((sweep_dir / "points").glob("*/record.json"))]
    full_cost = sum(node_seconds(r) for r in full)
    print(f"full sweep: {len(full)} runs, {full_cost:.1f} node-s (measured)")
    outcomes = []
    for trial in range(1 if args.reuse else args.trials):
        if not args.reuse:
            shutil.rmtree(sweep_dir / "adaptive", ignore_errors=True)
            run(snakemake, "-s", "workflow/adaptive.smk", "--cores", "1", "--configfile", str(sweep_file), "--quiet")
        print(f"\n--- adaptive sweep, trial {trial + 1}")
        outcomes.append(compare(full, full_cost, sweep_dir))
    print(f"\nover {len(outcomes)} adaptive sweep(s) (medians; the range in brackets):")
    later = [o["later_rounds"] for o in outcomes]
    print(f"rounds after round 0 that measured points: {statistics.median(later):g} ({min(later)}–{max(later)})")
    saved = [o["saved"] for o in outcomes]
    print(
        f"saved: {100 * statistics.median(saved):.1f} % ({100 * min(saved):.1f}–{100 * max(saved):.1f} %), "
        "target ≥ 90 %"
    )
    for method in METHODS:
        lost = [o["lost"][method] for o in outcomes if o["lost"].get(method) is not None]
        if lost:
            print(
                f"accuracy lost, {method:<8}: {statistics.median(lost):.2f} points "
                f"({min(lost):.2f} to {max(lost):.2f}), target ≤ 2"
            )
    return 0


METHODS = ("ddlbench", "extrap")


def compare(full, full_cost: float, sweep_dir: Path) -> dict:
    """One adaptive sweep against the full one: share saved, rounds after round 0 that measured, and per
    search the points of accuracy lost at the configurations it did not measure."""
    folder = sweep_dir / "adaptive"
    sampled = [read_record(p) for p in sorted((folder / "points").glob("*/record.json"))]
    launches = [read_launch(p) for p in sorted((folder / "launches").glob("*.json"))]
    summary = json.loads((folder / "sampling.json").read_text())
    sampled_cost = spent_node_s(launches)
    saved = 1 - sampled_cost / full_cost
    print(
        f"adaptive:   {len(sampled)} runs in {len(launches)} launches over {len(summary['rounds'])} rounds, "
        f"{sampled_cost:.1f} node-s (measured: Σ nodes × launch wall time, round 0 included)"
    )
    print(
        "            per round: "
        + ", ".join(f"{r['round']}: {r['points']} runs/{r['launches']} launches" for r in summary["rounds"])
    )
    print(f"            stopped: {summary['rounds'][-1]['why']}")
    bound = summary.get("round0_share_bound")
    budget = summary.get("budget_node_s")
    print(
        f"            overheads: {summary['launch_overhead_s']:.2f} s per launch, "
        f"{summary['point_overhead_s']:.2f} s per point in a launch (medians, measured)"
    )
    if bound is not None:
        print(f"            round 0 may cost at most {100 * bound:.1f} % of the full sweep (its bound, before it ran)")
    if budget is not None:
        print(f"            budget {budget:.1f} node-s (last planned against); within it: {summary['within_budget']}")
    print(f"saved: {100 * saved:.1f} % of the profiling cost")
    estimate = summary["full_sweep_node_s_estimated"]
    print(f"       (the adaptive sweep's estimate of the full cost: {estimate or float('nan'):.1f} node-s)")
    measured_batches = {r.point.batch_size for r in sampled}
    figure = summary["settings"]["figure"]
    lost: dict[str, float | None] = {}
    for method, key in zip(METHODS, ("models", "models_extrap"), strict=True):
        print(f"{figure} at the configurations the adaptive sweep did not measure, {method} search:")
        lost[method] = _score(full, summary[key], measured_batches, figure)
    return {"saved": saved, "later_rounds": summary["rounds_measured_after_round_0"], "lost": lost}


def _score(full, models: list, measured_batches: set, figure: str) -> float | None:
    if not models:
        print("  no model (fewer than two configurations measured)")
        return None
    (model,) = models
    print(f"{'batch':>6} {'full median':>12} {'predicted':>10} {'95 % PI':>22} {'accuracy':>9} {'repeatability':>14}")
    accuracies, floors = [], []
    predicted = {p["x"][0]: p for p in model["predictions"]}
    for batch in sorted({r.point.batch_size for r in full} - measured_batches):
        reps = [_figure(r, figure) for r in full if r.point.batch_size == batch and r.status == "ok"]
        median = statistics.median(reps)
        p = predicted[float(batch)]
        accuracy = 1 - abs(p["value"] - median) / median
        floor = statistics.fmean(1 - abs(v - median) / median for v in reps)
        accuracies.append(accuracy)
        floors.append(floor)
        band = "–" if p["low"] is None else f"[{p['low']:.4g}, {p['high']:.4g}]"
        print(
            f"{batch:>6} {median:>12.4g} {p['value']:>10.4g} {band:>22} {100 * accuracy:>8.1f}% {100 * floor:>13.1f}%"
        )
    print(f"model: {figure} = {model['formula']} (LOO SMAPE {model['cv_smape_percent']})")
    if not accuracies:
        return None
    lost = 100 * (statistics.fmean(floors) - statistics.fmean(accuracies))
    print(
        f"mean accuracy {100 * statistics.fmean(accuracies):.2f} % against the full sweep's repeatability "
        f"{100 * statistics.fmean(floors):.2f} %: {lost:.2f} points lost"
    )
    return lost


def _figure(record, figure: str) -> float:
    metrics = record.metrics
    if figure == "step_time_s":
        return record.point.global_batch_size / metrics.samples_per_s_overall
    if figure == "samples_per_s":
        return metrics.samples_per_s_overall
    raise SystemExit(f"this benchmark compares step_time_s or samples_per_s, not {figure}")


if __name__ == "__main__":
    sys.exit(main())
