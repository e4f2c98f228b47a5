"""How long does finishing a large sweep take (`ddlbench report --configfile`, the one road from records
to the table, predictions, scaling models, history and report), and how big is its report?

Synthesises the records of a sweep of --points points (default 10,000: 5 models × 2 datasets × 4
data-parallel strategies × nodes 1-16 × 1 or 2 ranks per node × 5 batch sizes × --points / 2,000
repetitions; 2,000 series to model, 400 configurations × 5 figures) into a temporary folder with
ddlbench.records.write_record, as a real sweep leaves them: about 3 % of them failed, out of memory or
timed out, every successful one with 20 measured steps, its phases and its straggler. A machine
certificate (certificate.json) sits beside them, so the report has its health block.

Then, --repeats times, in turn, it runs as subprocesses, end to end as a user or Snakemake would
(interpreter start and imports included; the cores this process may use, as `nproc` says, all used):

  finish              `ddlbench -q report --configfile F`   what Snakemake's report rule runs: records →
                      table.parquet/csv, models.json, the sweep in the results database (in the temporary
                      folder), report.html and report.md
  finish --no-history the same without the results database
  render              `ddlbench -q report --configfile F --table T`   table → report (render only)

and prints the median wall-clock time of each with every run, the time of each step of the finish in one
more run inside this process (ddlbench.finish.Finished.seconds), the size of report.html in MB (10^6
bytes) and of report.md. Nothing is written outside the temporary folder. The goal (issue 30): finish
under 10 s at 10,000 records on 2 cores.

    make bench-report                                 # = .venv/bin/python benchmarks/report_speed.py
    .venv/bin/python benchmarks/report_speed.py --points 2000 --repeats 1 --keep /tmp/report-speed
    .venv/bin/python benchmarks/report_speed.py --quick --repeats 1         # 32 points, seconds: what CI runs
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ddlbench.config import load_sweep_config
from ddlbench.finish import finish_sweep
from ddlbench.parallel import usable_cpus
from ddlbench.point import Point
from ddlbench.records import (
    MEASUREMENT_VERSION,
    Metrics,
    PointRecord,
    Provenance,
    RankResult,
    Stats,
    Straggler,
    record_path,
    write_record,
)
from ddlbench.sweep import expand_sweep

BIN = Path(sys.executable).parent
TIMEOUT_S = 900
STEPS = 20
POINTS_PER_REPETITION = 5 * 2 * 4 * 5 * 2 * 5
# --quick (CI's size, seconds): 2 models × 1 dataset × ddp, zero2 × nodes 1, 2 × 1 rank × 2 batch sizes × 2
# repetitions = 32 points, every part of the report still drawn
QUICK_AXES = {
    "models": ["resnet8", "resnet20"],
    "datasets": ["cifar10"],
    "strategies": ["ddp", "zero2"],
    "nodes": [1, 2],
    "ranks_per_node": [1],
    "batch_size": [16, 32],
    "repetitions": 2,
}
# samples/s of one rank at batch 32 (made up; only their order matters to the report)
MODEL_SPEED = {"resnet8": 900.0, "resnet20": 400.0, "resnet18": 120.0, "vgg11": 150.0, "mobilenet_v2": 200.0}
STRATEGY_EFFICIENCY = {"ddp": 0.92, "horovod": 0.9, "zero2": 0.85, "fsdp": 0.8}
FAILURES = (  # (share of points, status, reason)
    (0.015, "failed", "rank 1 on n1: RuntimeError: Connection reset by peer"),
    (0.004, "failed", "diverged: loss is nan at step 7 (warm-up included)"),
    (0.008, "oom", "rank 0 on n0: OutOfMemoryError: CPU out of memory"),
    (0.003, "timeout", "ran past its limit of 600 s; the ranks still running were stopped"),
)


def sweep_config(points: int, results_dir: Path, *, quick: bool = False) -> dict[str, object]:
    config = {
        "name": "report-speed",
        "results_dir": str(results_dir),
        "models": list(MODEL_SPEED),
        "datasets": ["cifar10", "mnist"],
        "strategies": list(STRATEGY_EFFICIENCY),
        "nodes": [1, 2, 4, 8, 16],
        "ranks_per_node": [1, 2],
        "batch_size": [16, 32, 64, 128, 256],
        "repetitions": points // POINTS_PER_REPETITION,
        "steps": STEPS,
    }
    return config | QUICK_AXES if quick else config


def synthetic_record(point: Point, rng: random.Random) -> PointRecord:
    """A record of `point` as its launch could have written it: ok, or one of FAILURES by chance."""
    world = point.world_size
    provenance = Provenance(
        ddlbench_version="0.1.0",
        git_commit="0123456789abcdef",
        git_dirty=False,
        python_version="3.11.7",
        torch_version="2.13.0",
        backend="gloo",
        launcher="srun",
        hostnames=tuple(f"n{i}" for i in range(point.nodes)),
        cpu_model="Synthetic CPU @ 2.0GHz",
        gpu_model=None,
        slurm_job_id=str(rng.randrange(10**6)),
        config_hash=point.spec_hash,
        start_time="2025-01-01T00:00:00Z",
        end_time="2025-01-01T00:01:00Z",
    )
    draw, edge = rng.random(), 0.0
    for share, status, reason in FAILURES:
        edge += share
        if draw < edge:
            return PointRecord(
                point_id=point.point_id, point=point, status=status, reason=reason, metrics=None, provenance=provenance
            )
    one_rank = MODEL_SPEED[point.model] * (point.batch_size / 32) ** 0.3 * (1.3 if point.dataset == "mnist" else 1.0)
    scaling = STRATEGY_EFFICIENCY[point.strategy] ** (world.bit_length() - 1)
    speed = one_rank * world * scaling * rng.uniform(0.95, 1.05)
    per_step = [speed * rng.uniform(0.9, 1.1) for _ in range(STEPS)]
    step_times = [point.global_batch_size / value for value in per_step]
    step = statistics.median(step_times)
    phases = {
        name: Stats.of([step * share * rng.uniform(0.9, 1.1) for _ in range(STEPS)])
        for name, share in (("data_s", 0.02), ("forward_s", 0.3), ("backward_s", 0.5), ("update_s", 0.08))
    }
    phases["comm_exposed_s"] = Stats.of([step * 0.08 * rng.uniform(0.5, 1.5) for _ in range(STEPS)])
    phases["other_s"] = Stats.of([step * 0.02 * rng.uniform(0.5, 1.5) for _ in range(STEPS)])
    straggler = None
    if world > 1:
        straggler = Straggler(
            rank=rng.randrange(world),
            hostname=f"n{rng.randrange(point.nodes)}",
            slowest_steps=rng.randrange(1, STEPS + 1),
            steps=STEPS,
            skew_s=Stats.of([step * 0.05 * rng.random() for _ in range(STEPS)]),
            wait_s=Stats.of([step * 0.03 * rng.random() for _ in range(STEPS)]),
            wait_share=Stats.of([0.03 * rng.random() for _ in range(STEPS)]),
        )
    memory = int(2e6 * MODEL_SPEED["resnet8"] / MODEL_SPEED[point.model] * point.batch_size)
    metrics = Metrics(
        step_time_s=Stats.of(step_times),
        samples_per_s=Stats.of(per_step),
        samples_per_s_overall=point.global_batch_size * STEPS / sum(step_times),
        global_batch_size=point.global_batch_size,
        peak_rss_bytes=memory * 3,
        cuda_peak_allocated_bytes=None,
        cuda_peak_reserved_bytes=None,
        loss_first=2.3,
        loss_last=2.0 + rng.random() * 0.1,
        tensor_peak_bytes=memory,
        tensor_resident_bytes=memory // 2,
        window_s=sum(step_times),
        step_times_job_s=tuple(step_times),
        phases_s=phases,
        comm_overlap=Stats.of([rng.uniform(0.3, 0.7) for _ in range(STEPS)]),
        update_gap_s=Stats.of([step * rng.uniform(0.8, 0.9) for _ in range(STEPS)]),
        straggler=straggler,
    )
    ranks = tuple(  # two ranks with three steps, as tests/test_aggregate.py's records have
        RankResult(
            rank=rank,
            hostname=f"n{rank // point.ranks_per_node}",
            step_times_s=tuple(step_times[:3]),
            losses=(2.3, 2.2, 2.1),
            peak_rss_bytes=memory * 3,
            tensor_peak_bytes=memory,
            facts={"local_parameters": 270_000},
        )
        for rank in range(min(world, 2))
    )
    return PointRecord(
        point_id=point.point_id,
        point=point,
        status="ok",
        reason=None,
        metrics=metrics,
        provenance=provenance,
        ranks=ranks,
        measurement_version=MEASUREMENT_VERSION,
    )


def certificate() -> dict[str, object]:
    """A machine certificate in the shape `ddlbench certify` writes: one figure failing, one node outside."""
    figures = [
        {"name": name, "unit": unit, "value": value, "ci_low": value * 0.98, "ci_high": value * 1.02, "n": 12,
         "reference": reference, "lower": reference * 0.9, "upper": reference * 1.1,
         "deviation": value / reference - 1, "passed": abs(value / reference - 1) <= 0.1,
         "status": "pass" if abs(value / reference - 1) <= 0.1 else "fail", "node": None}
        for name, unit, value, reference in (
            ("matmul_fp32", "GFLOP/s", 98.0, 100.0),
            ("memory_copy", "GB/s", 11.5, 12.0),
            ("allreduce_inter_node", "GB/s", 0.7, 1.0),
        )
    ]  # fmt: skip
    return {
        "passed": False,
        "system": "synthetic",
        "partition": "cpu",
        "date": "2025-01-01T00:00:00Z",
        "figures": figures,
        "nodes_outside": ["n7"],
        "regressions": [],
    }


def _size(plan, name: str) -> str:
    return f"{(plan.config.sweep_dir / name).stat().st_size / 1e6:.1f} MB"


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        sys.exit(f"report_speed: {' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=10_000, help=f"a multiple of {POINTS_PER_REPETITION}")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each command (default 3)")
    parser.add_argument("--keep", type=Path, help="copy the sweep's folder (records, table, report) here")
    parser.add_argument("--quick", action="store_true", help="a 32-point sweep instead of --points (seconds; CI)")
    args = parser.parse_args()
    if args.quick:
        args.points = math.prod(len(QUICK_AXES[axis]) for axis in QUICK_AXES if axis != "repetitions")
        args.points *= QUICK_AXES["repetitions"]
    elif args.points <= 0 or args.points % POINTS_PER_REPETITION:
        parser.error(f"--points {args.points}: must be a positive multiple of {POINTS_PER_REPETITION}")
    if args.repeats <= 0:
        parser.error(f"--repeats {args.repeats}: must be at least 1")

    with tempfile.TemporaryDirectory(prefix="report-speed-") as tmp:
        config_path = Path(tmp) / "sweep.yaml"
        sweep = sweep_config(args.points, Path(tmp) / "results", quick=args.quick)
        config_path.write_text(yaml.safe_dump(sweep, sort_keys=False))
        plan = expand_sweep(load_sweep_config(config_path))
        if len(plan.points) != args.points:
            sys.exit(f"report_speed: the sweep expands to {len(plan.points)} points, not {args.points}")
        rng = random.Random(0)
        start = time.perf_counter()
        for point in plan.points:
            write_record(record_path(plan.config.sweep_dir, point.point_id), synthetic_record(point, rng))
        (plan.config.sweep_dir / "certificate.json").write_text(json.dumps(certificate(), indent=1))
        print(f"wrote {args.points} records in {time.perf_counter() - start:.1f} s")

        ddlbench = [str(BIN / "ddlbench"), "-q"]
        table_path = plan.config.sweep_dir / "table.parquet"
        finish = [*ddlbench, "report", "--configfile", str(config_path)]
        commands = {
            "finish": finish,
            "finish --no-history": [*finish, "--no-history"],
            "render": [*finish, "--table", str(table_path)],
        }
        times: dict[str, list[float]] = {label: [] for label in commands}
        for _ in range(args.repeats):
            for label, command in commands.items():
                began = time.perf_counter()
                run(command)
                times[label].append(time.perf_counter() - began)
        finished = finish_sweep(load_sweep_config(config_path), store_history=False)
        html = plan.config.report_path
        markdown = html.with_suffix(".md")
        sizes = [record_path(plan.config.sweep_dir, p.point_id).stat().st_size for p in plan.points]
        if args.keep:
            shutil.copytree(plan.config.sweep_dir, args.keep, dirs_exist_ok=True)

        print(
            f"{args.points} points (records of {statistics.mean(sizes) / 1e3:.1f} kB on average), median of "
            f"{args.repeats} run(s), wall-clock seconds, each command a subprocess, {usable_cpus()} CPU(s)"
        )
        for label, seconds in times.items():
            runs = ", ".join(f"{s:.2f}" for s in seconds)
            print(f"  {label:<24} {statistics.median(seconds):7.2f} s   (runs: {runs})")
        steps = ", ".join(f"{step} {value:.2f}" for step, value in finished.seconds.items())
        print(f"  (the finish's steps, one run in-process without history: {steps} s)")
        models = len(json.loads(finished.models.read_text())["models"])
        print(f"  models.json {_size(plan, 'models.json')}, {models} models")
        print(f"  report.html {html.stat().st_size / 1e6:16.2f} MB")
        if markdown.exists():
            print(f"  report.md   {markdown.stat().st_size / 1e3:16.1f} kB")


if __name__ == "__main__":
    main()
