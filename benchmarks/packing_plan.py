"""Planning a study-sized sweep in packed allocations, on paper (nothing is submitted).

A sweep of 10,080 points (4 models × 6 strategies × 7 node counts 1–64 × 4 batch sizes × 3 thread counts ×
5 repetitions) on a described partition of 1,000 nodes whose MaxTime is 24 h. Each point's expected time is
a launch of 20 s plus 100 steps of a step time that grows with the model and the batch and shrinks with
the threads; its limit (timeout) is 3× that, at least 5 min: the durations are this benchmark's own, made
up to span 40 s to about 40 min as real sweeps do, not measured ones.

Printed, for allocations of 64 nodes (`--pack auto`: the widest point), 250 and 1,000 nodes:
- packing time: wall seconds of ddlbench.launch.packing.pack, median of 3 runs;
- allocations: how many jobs go to SLURM (against 10,080 with a job per point);
- predicted makespan: the allocations one after another, at the expected times (hours);
- idle share: idle ÷ allocated node-hours at the expected times (target ≤ 10 %);
- makespan ÷ bound: against max(longest point, node-hours ÷ nodes), per allocation, the worst one;
and the same packing in the sweep's own order (no widest-first), to show what the order buys.

    python benchmarks/packing_plan.py [--points-scale 1.0] [--seed 0] [--repetitions 5] [--widths 64,250,1000]
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddlbench.launch.packing import Task, pack, simulate

MODELS = {"resnet50": 0.20, "vgg16": 0.35, "bert_base": 0.60, "gpt2_medium": 1.10}  # s per step at batch 64
STRATEGIES = {"ddp": 1.0, "zero2": 1.1, "fsdp": 1.25, "gpipe": 1.4, "1f1b": 1.3, "dp_filter": 1.5}
NODES = (1, 2, 4, 8, 16, 32, 64)
BATCHES = (16, 32, 64, 128)
THREADS = (1, 2, 4)
REPETITIONS = 5
PARTITION_NODES = 1000
MAX_TIME_S = 24 * 3600


def sweep(scale: float, seed: int, repetitions: int = REPETITIONS) -> list[Task]:
    rng = random.Random(seed)
    tasks = []
    grid = itertools.product(MODELS.items(), STRATEGIES.items(), NODES, BATCHES, THREADS, range(repetitions))
    for (model, cost), (strategy, factor), nodes, batch, threads, rep in grid:
        step = cost * factor * (batch / 64) * (1 + 0.08 * nodes.bit_length()) / threads**0.5
        expected = (20 + 100 * step) * scale * rng.uniform(0.9, 1.1)
        limit = max(300.0, 3 * expected)
        key = f"{model}-{strategy}-n{nodes}-b{batch}-t{threads}-r{rep}"
        tasks.append(Task(key=key, nodes=nodes, limit_s=limit, expected_s=expected))
    return tasks


def figures(tasks: list[Task], width: int) -> dict[str, float]:
    times = []
    for _ in range(3):
        began = time.perf_counter()
        packing = pack(tasks, width, max_time_s=MAX_TIME_S)
        times.append(time.perf_counter() - began)
    worst_ratio = max(a.expected.makespan_s / a.lower_bound_s for a in packing.allocations)
    return {
        "packing_s": statistics.median(times),
        "allocations": len(packing.allocations),
        "makespan_h": packing.makespan_s / 3600,
        "node_h": packing.allocated_node_s / 3600,
        "idle": packing.idle_share,
        "ratio": worst_ratio,
    }


def noisy_idle(tasks: list[Task], width: int, seed: int) -> float:
    """Idle share when each point really takes its expected time × a log-normal factor (σ = 0.5, so half of
    them are off by more than ×1.4): the dispatcher keeps the plan's order and starts what fits as nodes
    free up, so the plan's idle share is only as good as this says."""
    rng = random.Random(seed + 1)
    packing = pack(tasks, width, max_time_s=MAX_TIME_S)
    busy = allocated = 0.0
    for allocation in packing.allocations:
        real = [
            Task(key=t.key, nodes=t.nodes, limit_s=t.limit_s, expected_s=t.expected_s * rng.lognormvariate(0, 0.5))
            for t in allocation.order
        ]
        schedule, _ = simulate(real, [f"#{i}" for i in range(width)], which="expected")
        busy += sum(t.nodes * t.expected_s for t in real)
        allocated += width * schedule.makespan_s
    return 1 - busy / allocated


def unordered_idle(tasks: list[Task], width: int) -> float:
    """Idle share of one allocation of `width` nodes running the points in the sweep's own order."""
    schedule, _ = simulate(tasks, [f"#{i}" for i in range(width)], which="expected")
    busy = sum(t.nodes * t.expected_s for t in tasks)
    return 1 - busy / (width * schedule.makespan_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points-scale", type=float, default=1.0, help="multiply every duration (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repetitions", type=int, default=REPETITIONS, help="of each point (default 5: 10,080 points)")
    parser.add_argument("--widths", default="64,250,1000", help="allocation widths to plan (nodes)")
    args = parser.parse_args()
    tasks = sweep(args.points_scale, args.seed, args.repetitions)
    work_h = sum(t.nodes * t.expected_s for t in tasks) / 3600
    print(f"sweep: {len(tasks)} points, {work_h:.0f} node-hours expected; partition: {PARTITION_NODES} nodes, "
          f"MaxTime {MAX_TIME_S / 3600:.0f} h")  # fmt: skip
    print(f"per-point jobs: {len(tasks)} submissions; no idle node inside a job; the bound for the same work on "
          f"the whole partition: {work_h / PARTITION_NODES:.1f} h")  # fmt: skip
    print(f"{'nodes':>6} {'allocs':>6} {'plan s':>7} {'makespan h':>10} {'node-h':>8} {'idle':>6} "
          f"{'worst ÷ bound':>13} {'idle, times off':>15} {'idle, sweep order':>17}")  # fmt: skip
    for width in (int(w) for w in args.widths.split(",")):
        f = figures(tasks, width)
        single = f"{unordered_idle(tasks, width):.1%}" if f["allocations"] == 1 else "-"
        off = noisy_idle(tasks, width, args.seed)
        print(f"{width:>6} {f['allocations']:>6} {f['packing_s']:>7.2f} {f['makespan_h']:>10.1f} {f['node_h']:>8.0f} "
              f"{f['idle']:>6.1%} {f['ratio']:>13.3f} {off:>15.1%} {single:>17}")  # fmt: skip
    print("makespan h: the allocations one after another at the expected times; idle: idle ÷ allocated node-hours "
          "there; worst ÷ bound: the allocation furthest from max(longest point, node-hours ÷ nodes); "
          "idle, times off: the same allocations when every point takes its expected time × lognormal(σ 0.5); "
          "idle, sweep order: one allocation running the points as listed (-: the plan needs several)")  # fmt: skip


if __name__ == "__main__":
    main()
