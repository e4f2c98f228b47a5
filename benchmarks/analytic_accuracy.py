"""How good the analytical model's predictions are on this machine: calibrate, measure a sweep, compare.

    python benchmarks/analytic_accuracy.py                      # calibrate, run the sweep, print accuracies
    python benchmarks/analytic_accuracy.py --machine M.yaml     # skip the calibration, predict from M
    python benchmarks/analytic_accuracy.py --report-only        # reuse what an earlier run measured
    python benchmarks/analytic_accuracy.py --quick --results-dir /tmp/a   # CI's size: a minute, no verdict
    python benchmarks/analytic_accuracy.py --set scoring         # the frozen scoring set: what is reported
    python benchmarks/analytic_accuracy.py --set pipeline-development   # 1F1B beside DDP: a second development sweep

1. `ddlbench calibrate` with benchmarks/analytic/calibration.yaml (compute rates, collectives after a
   barrier and in busy mode, generic operators over drawn shapes, and the layer timings of one model, resnet8)
   → <results>/machine.yaml;
2. Snakemake runs benchmarks/analytic/sweep.yaml (issue 22's held-out sweep: resnet20 and vgg11 at batch
   16, ddp and zero2 on 1 and 2 nodes × 1 rank, gpipe with 4 micro-batches, filter and spatial on 2; and
   resnet8 at its profiled batch beside them; 3 repetitions) with `machine:` pointing at that file, so
   the DAG predicts every point before the report and the report sets predicted beside measured, and
   `alone: true`, so each point runs with the host to itself (never two one-rank points side by side);
3. prints, per strategy, the mean time and memory accuracy (1 − |predicted − measured| / measured; time:
   the configuration's median step, the median over its repetitions; memory: the busiest rank's peak
   tensor memory), their worst configuration and n, separately for configurations *never seen* by the
   calibration (no layer timings of the model: compute from the operator fits; the headline, against
   issue 22's targets: ≥ 90 % time averaged over strategies, ≥ 95 % for data parallelism, memory ≥ 95 %,
   with the gap) and *profiled* ones (the calibration ran the model, at that batch: partly circular);
   then every point alone against issue 12's targets, as before;
4. scores the recommendation (ddlbench.analysis.analytic.recommendation): per cell (a model at one scale,
   two strategies or more), the configuration predicted fastest in samples/s against the measured best,
   a hit when it is the best or not measurably slower over the launches; the share of hits against issue
   22's target (≥ 90 %), with a line per cell; accuracy.json keeps it under "recommendation".

Nothing else should run on the machine meanwhile: the sweep's timings are what is being predicted, and
the calibration measures the machine as it is then (on a CPU shared with others, its load included).

--quick runs benchmarks/analytic/quick_calibration.yaml and quick_sweep.yaml instead (ddp and gpipe on
resnet8, a few steps, a few operators): the same steps and printout in a minute, to show the benchmark
still runs; its accuracies say nothing. --results-dir puts the calibration, the sweep and the report
under another folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent / "analytic"
DATA_PARALLEL = ("ddp", "horovod", "zero2", "fsdp")
# the sweep each set runs: development (issue 22's held-out sweep, tuned on since) and scoring (frozen on
# 2026-11-28 before any change was tried on it; the model's accuracy is reported on it alone)
SETS = {
    "development": "sweep.yaml",
    "pipeline-development": "pipeline_sweep.yaml",
    "scoring": "scoring_sweep.yaml",  # the first scoring set: run four times, each after a change (worn)
    "scoring-2": "scoring2_sweep.yaml",  # the second: run once, then changed for (seen)
    "scoring-3": "scoring3_sweep.yaml",  # the third: run twice, then the tensor and zero2 terms came (seen)
    "tensor-development": "tensor_sweep.yaml",  # tensor parallelism's DTensor costs, on scoring-2's seen gpt_tiny
    "scoring-4": "scoring4_sweep.yaml",  # the fourth, frozen (2026-12-01) before anything was run on it
    "memory-of-scoring-4": "scoring4_memory_sweep.yaml",  # its memory: its run warmed up too little to probe
    "scoring-5": "scoring5_sweep.yaml",  # the fifth, frozen (2026-12-02) before anything was run on it (seen)
    "scoring-6": "scoring6_sweep.yaml",  # the sixth, frozen (2026-12-02) before anything was run on it (seen)
    "scoring-7": "scoring7_sweep.yaml",  # the seventh, frozen (2026-12-02) before anything was run on it (seen)
    "scoring-8": "scoring8_sweep.yaml",  # the eighth, frozen (2026-12-02) before anything was run on it (seen)
    "scoring-9": "scoring9_sweep.yaml",  # the ninth, frozen (2026-12-02) before anything was run on it (seen)
    "scoring-10": "scoring10_sweep.yaml",  # the tenth, frozen (2026-12-02) before anything was run on it (seen)
    "large-development": "large_sweep.yaml",  # tensors past the last-level cache, on seen configurations
    "scoring-11": "scoring11_sweep.yaml",  # the eleventh, frozen (2026-12-03) before anything was run on it (seen)
    "scoring-12": "scoring12_sweep.yaml",  # the twelfth, frozen (2026-12-03) before anything was run on it (seen)
    "scoring-13": "scoring13_sweep.yaml",  # the thirteenth, frozen (2026-12-03) before anything was run on it (seen)
    "scoring-14": "scoring14_sweep.yaml",  # the fourteenth, frozen (2026-12-03), run on the model of c2a054d (seen)
    "scoring-15": "scoring15_sweep.yaml",  # the fifteenth, frozen (2026-12-03), run on the model of 2fcbc78 (seen)
    "scoring-16": "scoring16_sweep.yaml",  # the sixteenth, frozen (2026-12-04), run on the model of 2fcbc78 (seen)
    # Linears of 32 MiB or more (alexnet, vgg16), on configurations of the fourteenth and fifteenth sets (seen)
    "linear-development": "linear_sweep.yaml",
    "scoring-17": "scoring17_sweep.yaml",  # the seventeenth, frozen (2026-12-04), run on the model of 4eaa63c (seen)
    "scoring-18": "scoring18_sweep.yaml",  # the eighteenth, frozen (2026-12-04), run on the model of 99f0fed (seen)
    "scoring-19": "scoring19_sweep.yaml",  # the nineteenth, frozen (2026-12-04), run on the model of 820e691 (seen)
    "scoring-20": "scoring20_sweep.yaml",  # the twentieth, frozen (2026-12-04), run on the model of 2f20c52 (seen)
    # made after the twentieth was frozen (SETS is in the order the sets were made): glibc told to keep what it
    # frees, on seen configurations of both failure modes (resnet20 on 224², VGG and ResNet-50 on 512² maps)
    "allocator-development": "allocator_sweep.yaml",
    "scoring-21": "scoring21_sweep.yaml",  # the twenty-first, frozen (2026-12-04), run on the model of c3b2b1c (seen)
    "scoring-22": "scoring22_sweep.yaml",  # the twenty-second, frozen (2026-12-05), run on the model of c3b2b1c (seen)
    "scoring-23": "scoring23_sweep.yaml",  # the twenty-third, frozen (2026-12-05), run on the model of 8220910 (seen)
    "scoring-24": "scoring24_sweep.yaml",  # the twenty-fourth, frozen (2026-12-05), run on the model of 8220910 (seen)
    "scoring-25": "scoring25_sweep.yaml",  # the twenty-fifth, frozen (2026-12-05), run on the model of 8220910 (seen)
    "scoring-26": "scoring26_sweep.yaml",  # the twenty-sixth, frozen (2026-12-05), run on the model of 8220910 (seen)
    "scoring-27": "scoring27_sweep.yaml",  # the twenty-seventh, frozen (2026-12-05), run on the model of 8220910 (seen)
    "scoring-28": "scoring28_sweep.yaml",  # the twenty-eighth, frozen (2026-12-05), run on the model of 4f35b46 (seen)
    # made after the twenty-eighth was frozen: cosmoflow on 4×32³ (the third set's, seen), for the volume kinds
    "volume-development": "volume_sweep.yaml",
    "scoring-29": "scoring29_sweep.yaml",  # the twenty-ninth, frozen (2026-12-05), run on the model of a941ede (seen)
    "scoring-30": "scoring30_sweep.yaml",  # the thirtieth, frozen (2026-12-05), run on the model of a941ede (seen)
    "scoring-31": "scoring31_sweep.yaml",  # the thirty-first, frozen (2026-12-05), run on the model of f6b619b (seen)
    # made after the thirty-first was frozen: transformers on the thirtieth's and twenty-ninth's (seen) points
    "token-development": "token_sweep.yaml",
    "scoring-32": "scoring32_sweep.yaml",  # the thirty-second, frozen (2026-12-05), run on the model of 0835e98 (seen)
    "scoring-33": "scoring33_sweep.yaml",  # the thirty-third, frozen (2026-12-06), run on the model of 8c893b2 (seen)
    "scoring-34": "scoring34_sweep.yaml",  # the thirty-fourth, frozen (2026-12-06), run on the model of 13f54d7 (seen)
    # the thirty-fifth, frozen (2026-12-06), run on the model of 13f54d7 (its change was dropped; seen)
    "scoring-35": "scoring35_sweep.yaml",
    "scoring-36": "scoring36_sweep.yaml",  # the thirty-sixth, frozen (2026-12-06), run on the model of f61442f (seen)
    # made after the thirty-sixth was frozen: zero2 and ddp on configurations of the 34th and 35th (seen)
    "zero2-development": "zero2_sweep.yaml",
    "scoring-37": "scoring37_sweep.yaml",  # the thirty-seventh, frozen (2026-12-06), run on the model of f61442f (seen)
    "scoring-38": "scoring38_sweep.yaml",  # the thirty-eighth, frozen (2026-12-06), run on the model of 41d639a (seen)
    "scoring-39": "scoring39_sweep.yaml",  # the thirty-ninth, frozen (2026-12-06), run on the model of 8ab9e58 (seen)
    "scoring-40": "scoring40_sweep.yaml",  # the fortieth, frozen (2026-12-07), run on the model of 90324a2 (seen)
    "scoring-41": "scoring41_sweep.yaml",  # the forty-first, frozen (2026-12-07), run on the model of 90324a2 (seen)
    "scoring-42": "scoring42_sweep.yaml",  # the forty-second, frozen (2026-12-07), run on the model of 90324a2 (seen)
    "scoring-43": "scoring43_sweep.yaml",  # the forty-third, frozen (2026-12-07), run on the model of dec4a4b (seen)
    "scoring-44": "scoring44_sweep.yaml",  # the forty-fourth, frozen (2026-12-07), run on the model of 13040f5 (seen)
    "scoring-45": "scoring45_sweep.yaml",  # the forty-fifth, frozen (2026-12-07), run on the model of 13040f5 (seen)
    "scoring-46": "scoring46_sweep.yaml",  # the forty-sixth, frozen (2026-12-07), run on the model of 393606b (seen)
    "scoring-47": "scoring47_sweep.yaml",  # the forty-seventh, frozen (2026-12-07), run on the model of fd6f238 (seen)
    "scoring-48": "scoring48_sweep.yaml",  # the forty-eighth, frozen (2026-12-07) before the next change: never run
    "scoring-49": "scoring49_sweep.yaml",  # the forty-ninth, frozen (2026-12-08), run on the model of c2bc315 (seen)
}


def run(command: list[str]) -> None:
    print("$", " ".join(command), flush=True)
    started = time.perf_counter()
    # the workflow's rules call `ddlbench`: this interpreter's, whether or not its venv is active
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    subprocess.run(command, cwd=REPO, check=True, env={**os.environ, "PATH": path})
    print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)


def refuse_incomplete(machine: Path) -> None:
    """Stop where the calibration lost a point (a timeout, a crash): without its operator fits or collectives the
    model would fall back to rates and roofline, and the score would be of that, not of the model. A point the
    device refused (a precision it cannot run) is a fact of the machine, not a loss."""
    from ddlbench.analysis.machine.machine_file import read_machine

    failed = [point for point in read_machine(machine).get("failed_points") or [] if point.get("status") != "refused"]
    if failed:
        lost = "; ".join(f"{p.get('point_id')}: {p.get('status')} ({p.get('reason')})" for p in failed)
        raise SystemExit(
            f"{machine}: the calibration lost {len(failed)} point(s), so nothing is scored: {lost}. A timeout: raise "
            "the suite's timeout_s (benchmarks/analytic/*calibration.yaml) and calibrate again."
        )


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def gap(value: float | None, target: float) -> str:
    """', missed by X points' when `value` falls short of `target` (both fractions)."""
    if value is None or value >= target:
        return ""
    return f", {100 * (target - value):.1f} points short"


def measured_compute(row: dict) -> float:
    return sum(float(row.get(f"phase_{name}_s_median") or 0.0) for name in ("forward", "backward", "update"))


def per_model(configurations: pd.DataFrame) -> dict[str, tuple[float | None, float | None]]:
    """Per model: the mean over its strategies of each strategy's mean configuration accuracy (time, memory)."""
    out = {}
    for model, chosen in configurations.groupby("model"):
        means = chosen.groupby("strategy")[["time_accuracy", "memory_accuracy"]].mean().mean()
        pair = (means["time_accuracy"], means["memory_accuracy"])
        out[str(model)] = tuple(None if pd.isna(v) else float(v) for v in pair)
    return out


def print_table(rows, repeatability: dict[str, float] | None = None) -> None:
    """Per strategy: n, time and memory accuracy (mean, worst) and, given, how well one repetition
    predicted another (the machine's own noise: no model can do better against single runs)."""
    extra = f" {'repetitions agree':>18}" if repeatability is not None else ""
    head = f"{'strategy':<18} {'n':>3} {'time mean':>10} {'time worst':>11} {'memory mean':>12} {'memory worst':>13}"
    print(head + extra)
    for r in rows:
        agree = f" {pct((repeatability or {}).get(r.strategy)):>18}" if repeatability is not None else ""
        print(
            f"{r.strategy:<18} {r.points:>3} {pct(r.time_accuracy):>10} {pct(r.time_worst):>11} "
            f"{pct(r.memory_accuracy):>12} {pct(r.memory_worst):>13}{agree}"
        )


def second_calibration(
    suite: Path, before: Path, after: Path, sweep_file: Path, table: pd.DataFrame, *, rerun: bool
) -> dict:
    """The calibration run again after the sweep, and the never-seen configurations predicted from it: how
    much the headline owes to the minutes its calibration ran in (on a shared host, minutes apart, the same
    operators were timed up to 2× apart). Not the headline: that calibration had seen the sweep's host
    conditions end. Prints the score from each calibration and the ratio of their operator times."""
    from ddlbench.analysis.analytic.accuracy import NEVER_SEEN, by_strategy, join, overall, per_configuration
    from ddlbench.analysis.analytic.layout import Setting
    from ddlbench.analysis.analytic.machine_model import MachineModel
    from ddlbench.analysis.analytic.predict import predict_all, sweep_tables
    from ddlbench.analysis.analytic.render import predictions_csv
    from ddlbench.config import load_sweep_config
    from ddlbench.sweep import expand_sweep

    if rerun or not after.exists():
        run([sys.executable, "-m", "ddlbench", "calibrate", "--configfile", str(suite), "--out", str(after)])
    config = load_sweep_config(sweep_file)
    settings = [Setting.of_point(point) for point in expand_sweep(config).points]
    predicted = predict_all(settings, MachineModel.from_file(after), tables=sweep_tables(config.sweep_dir))
    configurations = per_configuration(join(table, pd.read_csv(io.StringIO(predictions_csv(predicted)))))
    chosen = configurations[configurations["seen"] == NEVER_SEEN]
    time_after, _ = overall(by_strategy(chosen)) if len(chosen) else (None, None)
    models = {m: t for m, (t, _) in per_model(chosen).items()} if len(chosen) else {}
    ratios = operator_ratios(before, after)
    print(
        f"\nthe same configurations predicted from a second calibration, run after the sweep ({after.name}; not the "
        f"headline): time {pct(time_after)} averaged over strategies (n = {len(chosen)} configurations); per model "
        + ", ".join(f"{m} {pct(t)}" for m, t in models.items())
    )
    print(
        "its operator times ÷ the first calibration's, median over the shapes both timed (forward + backward; n = "
        + ", ".join(str(n) for _, n in ratios.values())
        + " shapes), per count of ranks at once: "
        + "; ".join(f"{ranks} rank(s) ×{ratio:.2f}" for ranks, (ratio, _) in ratios.items())
    )
    return {
        "machine": str(after),
        "time_accuracy": time_after,
        "configurations": len(chosen),
        "by_model": models,
        "operator_ratio": {ranks: ratio for ranks, (ratio, _) in ratios.items()},
        "operator_shapes": {ranks: n for ranks, (_, n) in ratios.items()},
    }


# a host drift (the sweep's probes against the calibration's, median compute ratio) past which the headline is
# flagged: most scoring sets read ×0.93-1.09; the tenth, thirteenth and twenty-ninth ×1.32, ×0.69, ×0.69
DRIFT_WARNING = 0.10


def host_adjusted_score(machine: Path, sweep_file: Path, table: pd.DataFrame) -> dict | None:
    """The never-seen configurations predicted again from the machine file rescaled by the sweep's host probes
    against the calibration's (ddlbench.analysis.analytic.drift): the model's error with the host's drift taken
    out. A diagnosis beside the headline, never it: the probes ran with the points."""
    import statistics

    from ddlbench.analysis.analytic.accuracy import NEVER_SEEN, by_strategy, join, overall, per_configuration
    from ddlbench.analysis.analytic.drift import host_adjusted
    from ddlbench.analysis.analytic.layout import Setting
    from ddlbench.analysis.analytic.predict import sweep_tables
    from ddlbench.config import load_sweep_config
    from ddlbench.sweep import expand_sweep

    config = load_sweep_config(sweep_file)
    settings = {point.point_id: Setting.of_point(point) for point in expand_sweep(config).points}
    data = yaml.safe_load(machine.read_text()) or {}
    predicted, adjusted = host_adjusted(table, data, settings, tables=sweep_tables(config.sweep_dir))
    if not adjusted:
        print("\nno host probes in the machine file or the records (calibrated or measured before the probe)")
        return None
    configurations = per_configuration(join(table, predicted))
    chosen = configurations[configurations["seen"] == NEVER_SEEN]
    time_adjusted, _ = overall(by_strategy(chosen)) if len(chosen) else (None, None)
    models = {m: t for m, (t, _) in per_model(chosen).items()} if len(chosen) else {}

    def spread(name: str) -> str:
        values = [getattr(a.operators, name) for a in adjusted if a.operators and getattr(a.operators, name)]
        if not values:
            return "–"
        return f"median ×{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}]"

    latency = [a.collectives.latency for a in adjusted if a.collectives and a.collectives.latency]
    print(
        f"\nwith the host's drift taken out (the configurations predicted from the machine file rescaled by the "
        f"sweep's host probes against the calibration's; a diagnosis, not the headline): time {pct(time_adjusted)} "
        f"averaged over strategies (n = {len(chosen)} configurations); per model "
        + ", ".join(f"{m} {pct(t)}" for m, t in models.items())
    )
    print(
        f"host speed during the sweep ÷ during the calibration (the operator fits' ratios, per count of ranks at "
        f"once, over {len(adjusted)} configurations): compute "
        f"{spread('compute')}, memory {spread('memory')}, all-reduce latency "
        + (f"median ×{statistics.median(latency):.2f} (n = {len(latency)})" if latency else "–")
    )
    compute = [a.operators.compute for a in adjusted if a.operators and a.operators.compute]
    if compute and abs(statistics.median(compute) - 1) > DRIFT_WARNING:
        # the twenty-ninth set, scored on a machine file three hours older than its sweep: ×0.69, headline 62.2 %
        print(
            f"WARNING: the host ran its compute at ×{statistics.median(compute):.2f} the calibration's during the "
            f"sweep, more than {DRIFT_WARNING * 100:.0f} % off: the headline carries the drift of the host, not "
            "only the model's error. Calibrate in the sweep's hour (leave out --machine) and measure again."
        )
    return {
        "time_accuracy": time_adjusted,
        "configurations": len(chosen),
        "by_model": models,
        "speeds": [
            {"config_key": a.config_key, "probe": a.probe, "operators": a.operators and a.operators.__dict__}
            for a in adjusted
        ],
    }


def operator_ratios(before: Path, after: Path) -> dict[int, tuple[float, int]]:
    """Per count of ranks at once: the median over the shapes both timed of (forward + backward) after ÷
    before (dimensionless), and how many shapes that is."""
    import statistics

    def entries(path: Path) -> dict[int, dict[tuple, float]]:
        data = yaml.safe_load(path.read_text()) or {}
        out: dict[int, dict[tuple, float]] = {}
        for entry in data.get("operator_timings") or []:
            if entry.get("precision") != "fp32":
                continue
            shapes = out.setdefault(int(entry.get("ranks_per_node", 1)), {})
            for sample in entry.get("samples") or []:
                key = tuple(sorted((k, v) for k, v in sample.items() if not k.endswith("_s") and k != "n"))
                shapes[key] = float(sample["forward_s"]) + float(sample["backward_s"])
        return out

    first, second = entries(before), entries(after)
    return {
        ranks: (statistics.median(second[ranks][key] / first[ranks][key] for key in keys), len(keys))
        for ranks in sorted(set(first) & set(second))
        if (keys := set(first[ranks]) & set(second[ranks]))
    }


def print_recommendation(result) -> dict:
    """The recommendation's share (hits ÷ cells, against issue 22's target) over all cells and the never-seen
    ones, and a line per cell; returns the same for accuracy.json."""
    from ddlbench.analysis.analytic.accuracy import NEVER_SEEN

    held_out = result.of(NEVER_SEEN)
    print(
        f"\nrecommendation: the measured best or within its interval in {result.hits} of {result.n} cells "
        f"({pct(result.share)}; target ≥ {100 * result.target:.0f} %{gap(result.share, result.target)}); "
        f"never seen: {held_out.hits} of {held_out.n} ({pct(held_out.share)})"
    )
    print(f"  {result.rule}")
    for c in result.cells:
        interval = f" [{c.ci_low:.3g}, {c.ci_high:.3g}]" if c.ci_low is not None else ""
        ratio = "–" if c.ratio is None else f"{c.ratio:.3g}{interval}"
        print(
            f"  {'hit ' if c.hit else 'miss'} {c.label} ({c.seen}): compared {', '.join(c.compared)}; "
            f"recommended {c.recommended} (predicted {c.recommended_predicted_samples_per_s:.4g} samples/s, "
            f"measured {c.recommended_samples_per_s:.4g}), measured best {c.measured_best} "
            f"({c.best_samples_per_s:.4g} samples/s); recommended ÷ best {ratio}; {c.verdict}"
        )
    return {
        "rule": result.rule,
        "target": result.target,
        "hits": result.hits,
        "cells": result.n,
        "share": result.share,
        "never_seen": {"hits": held_out.hits, "cells": held_out.n, "share": held_out.share},
        "per_cell": [dataclasses.asdict(c) for c in result.cells],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machine", type=Path, help="predict from this machine file instead of calibrating")
    parser.add_argument(
        "--report-only", action="store_true", help="run nothing new (Snakemake reruns only what is missing)"
    )
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="the quick calibration and sweep (CI's size)")
    parser.add_argument(
        "--set",
        choices=tuple(SETS),
        default="development",
        help="development, pipeline-development, tensor-development, large-development, linear-development, "
        "allocator-development, volume-development, token-development, zero2-development: developed on; scoring to "
        "scoring-49: the scoring sets, each frozen before the change or model it scored and seen since (freeze a "
        "new one before the next change)",
    )
    parser.add_argument("--results-dir", type=Path, help="write under this folder instead of the files' results_dir")
    parser.add_argument(
        "--host-allocator",
        choices=("retain", "system"),
        help="the ranks' host allocator, for the calibration and the sweep alike (the sweep key host_allocator); "
        "default: what the results folder ran with, or retain for a new one",
    )
    parser.add_argument(
        "--no-second-calibration",
        action="store_true",
        help="skip the calibration after the sweep (the headline's calibration repeated, to say how much the "
        "score owes to which minutes the calibration ran in)",
    )
    args = parser.parse_args()

    prefix = "quick_" if args.quick else ""
    sweep_path = HERE / ("quick_sweep.yaml" if args.quick else SETS[args.set])
    print(f"set: {'quick (says nothing)' if args.quick else args.set} ({sweep_path.relative_to(REPO)})", flush=True)
    sweep = yaml.safe_load(sweep_path.read_text())
    if int(sweep.get("warmup_steps", 0)) < 2:  # ddlbench.train.memory probes a warm-up step, never the only one
        print(
            f"note: {sweep_path.name} warms up {sweep.get('warmup_steps', 0)} step(s); the memory probe needs 2, "
            "so no point's memory is measured and no memory accuracy is scored",
            flush=True,
        )
    calibration = HERE / f"{prefix}calibration.yaml"
    if args.results_dir is not None:
        sweep["results_dir"] = str(args.results_dir.resolve())
    results = REPO / sweep["results_dir"] / sweep["name"]
    results.mkdir(parents=True, exist_ok=True)
    # the ranks' host allocator, the calibration's and the sweep's alike: as asked; else the one a results folder
    # already ran with (a run from before the key: glibc's defaults, "system"), so that a report made again finds
    # its points' ids; else retain (docs/analytic.md, "The host allocator")
    ran = results / "sweep-run.yaml"
    allocator = args.host_allocator or (
        (yaml.safe_load(ran.read_text()) or {}).get("host_allocator", "system") if ran.exists() else "retain"
    )
    sweep["host_allocator"] = allocator
    print(f"host allocator: {allocator}", flush=True)
    # the suite as run, kept beside its results
    suite = yaml.safe_load(calibration.read_text()) | {"results_dir": sweep["results_dir"], "host_allocator": allocator}
    calibration = results / "calibration-suite.yaml"
    calibration.write_text(yaml.safe_dump(suite))
    machine = args.machine or results / "machine.yaml"
    if args.machine is None and not (args.report_only and machine.exists()):
        run(
            [
                sys.executable,
                "-m",
                "ddlbench",
                "calibrate",
                "--configfile",
                str(calibration),
                "--out",
                str(machine),
            ]
        )
    refuse_incomplete(machine)
    sweep["machine"] = str(machine.resolve())
    # each point with the host to itself, as the prediction assumes and as SLURM's whole nodes give: the
    # seventh set ran its one-rank points two at a time, and each one's times held its neighbour's load
    sweep["alone"] = True
    sweep_file = results / "sweep-run.yaml"  # the sweep as run, with its machine file
    sweep_file.write_text(yaml.safe_dump(sweep))
    # the points run once; the predictions and the report are made anew (the model may have changed)
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    run(
        [
            snakemake,
            "--cores",
            str(args.cores),
            "--configfile",
            str(sweep_file),
            "-q",
            "--forcerun",
            "report",  # finishes the sweep (ddlbench.finish): predictions on this machine file included
        ]
    )

    from ddlbench.analysis.analytic.accuracy import (
        NEVER_SEEN,
        PROFILED,
        by_strategy,
        join,
        overall,
        per_configuration,
        time_accuracy_interval,
    )
    from ddlbench.analysis.analytic.recommendation import score

    table = pd.read_parquet(results / "table.parquet")
    predictions = pd.read_csv(results / "predictions.csv")
    joined = join(table, predictions)
    configurations = per_configuration(joined)
    print(
        f"\nmachine {machine}; {len(joined)} measured points with predictions "
        f"({(table['status'] != 'ok').sum()} not ok), {len(configurations)} configurations"
    )
    print(
        "accuracy = 1 − |predicted − measured| / measured; time: a configuration's median step (median over "
        "its repetitions); memory: the busiest rank's peak tensor memory"
    )
    summary: dict = {}
    for label in (NEVER_SEEN, PROFILED):
        chosen = configurations[configurations["seen"] == label] if len(configurations) else configurations
        rows = by_strategy(chosen) if len(chosen) else []
        summary[label.replace(" ", "_")] = [r.__dict__ for r in rows]
        if label == NEVER_SEEN:
            print("\nnever seen (the calibration ran no part of the model: compute from its operator fits) — headline")
        else:
            print("\nprofiled (the calibration profiled the model, at these batches: partly circular)")
        if not rows:
            print("  none")
            continue
        agreement = chosen.dropna(subset=["repeatability"]).groupby("strategy")["repeatability"].mean()
        print_table(rows, {str(k): float(v) for k, v in agreement.items()})
        time_all, memory_all = overall(rows)
        dp = [r.time_accuracy for r in rows if r.strategy in DATA_PARALLEL and r.time_accuracy is not None]
        dp_time = sum(dp) / len(dp) if dp else None
        if label == NEVER_SEEN:
            print(
                f"headline: time {pct(time_all)} averaged over {len(rows)} strategies "
                f"(target ≥ 90 %{gap(time_all, 0.90)}), data parallelism {pct(dp_time)} "
                f"(target ≥ 95 %{gap(dp_time, 0.95)}), memory {pct(memory_all)} "
                f"(target ≥ 95 %{gap(memory_all, 0.95)}); n = {len(chosen)} configurations"
            )
            by_model = per_model(chosen)
            each = [f"{m} time {pct(t)} (≥ 90 %{gap(t, 0.90)}), memory {pct(mem)}" for m, (t, mem) in by_model.items()]
            print("per model (each averaged over its strategies, as the headline): " + "; ".join(each))
            summary["by_model"] = {m: {"time_accuracy": t, "memory_accuracy": mem} for m, (t, mem) in by_model.items()}
            # how much each figure owes to which launches ran: a bootstrap over each configuration's repetitions
            intervals = {"all": time_accuracy_interval(chosen)}
            intervals |= {str(m): time_accuracy_interval(rows_of) for m, rows_of in chosen.groupby("model")}
            print(
                "time accuracy with its 95 % bootstrap interval over launches (each configuration's repetitions "
                "resampled; the calibration's own noise not included), against the 90 % target:"
            )
            for name, interval in intervals.items():
                if interval is None:
                    print(f"  {name}: no interval (a configuration with fewer than two repetitions)")
                else:
                    print(
                        f"  {name}: {pct(interval.value)} [{pct(interval.low)}, {pct(interval.high)}]: "
                        f"{interval.against(0.90)}"
                    )
            summary["time_intervals"] = {
                name: None if i is None else {**i.__dict__, "target_0.90": i.against(0.90)}
                for name, i in intervals.items()
            }
            agree = chosen["repeatability"].dropna()
            print(
                f"repetitions agree to {pct(float(agree.mean()) if len(agree) else None)} on average "
                "(one run as a prediction of another: the machine's noise, the ceiling against single runs)"
            )
            summary["headline"] = {
                "time_accuracy": time_all,
                "data_parallel_time_accuracy": dp_time,
                "memory_accuracy": memory_all,
                "configurations": len(chosen),
                "repeatability": float(agree.mean()) if len(agree) else None,
            }
        else:
            print(
                f"profiled: time {pct(time_all)} over strategies, data parallelism {pct(dp_time)}, "
                f"memory {pct(memory_all)}"
            )

    rows = by_strategy(joined)
    print("\nevery point alone (repetitions apart, profiled and never seen together), against issue 12's targets")
    print_table(rows)
    time_all, memory_all = overall(rows)
    dp = [r.time_accuracy for r in rows if r.strategy in DATA_PARALLEL and r.time_accuracy is not None]
    print(
        f"average over strategies: time {pct(time_all)} (target ≥ 92 %), "
        f"memory {pct(memory_all)} (target ≥ 90 %)"  # –: no point's memory was probed
    )
    if dp:
        print(
            f"data parallelism ({', '.join(r.strategy for r in rows if r.strategy in DATA_PARALLEL)}): "
            f"time {100 * sum(dp) / len(dp):.1f} % (target ≥ 97 %)"
        )
    summary["recommendation"] = print_recommendation(score(joined))
    if len(configurations):
        worst = configurations.sort_values("time_accuracy").head(5)
        print("\nweakest time predictions (configurations):")
        for row in worst.to_dict("records"):
            print(
                f"  {row['point_id']} ({row['seen']}): measured {1e3 * row['step_time_s_median']:.1f} ms, "
                f"predicted {1e3 * row['predicted_step_time_s']:.1f} ms "
                f"(compute {1e3 * row['predicted_compute_s']:.1f}, "
                f"exposed communication {1e3 * row['predicted_comm_exposed_s']:.1f}, "
                f"bubble {1e3 * row['predicted_bubble_s']:.1f}; "
                f"measured phases: forward + backward + update {1e3 * measured_compute(row):.1f}, "
                f"exposed communication {1e3 * row.get('phase_comm_exposed_s_median', float('nan')):.1f})"
            )
    summary |= {
        "time_accuracy": time_all,
        "memory_accuracy": memory_all,
        "by_strategy": [r.__dict__ for r in rows],
    }
    if len(configurations):
        summary["host_adjusted"] = host_adjusted_score(machine, sweep_file, table)
    if args.machine is None and not args.no_second_calibration and len(configurations):
        summary["second_calibration"] = second_calibration(
            calibration, machine, results / "machine-after.yaml", sweep_file, table, rerun=not args.report_only
        )
    (results / "accuracy.json").write_text(json.dumps(summary, indent=1))
    print(f"\nreport: {results / 'report.html'}; figures: {results / 'accuracy.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
