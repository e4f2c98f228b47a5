"""Layer timings taken in rounds against one batch size after the other, beside a neighbour busy by spells.

A layer-timing point times a model's step at several batch sizes (ddlbench.train.calibration.layer_timing_kernel);
the analytic model fits each block's time α + β·batch over them, and a pipeline's prediction at another
micro-batch size rests on that fit. What matters is therefore the ratio between batch sizes, and this script
prints how far it moves from one calibration to the next:

    R = median step at the smaller batch ÷ median step at the larger one (one rank, `--iterations` timed steps
        each, after `--warmup` untimed ones), from one calibration.

Three kinds of calibration, alternated calibration by calibration so that the host's own drift falls on each alike:
- `quiet, in rounds`: as the kernel times now (rounds of every batch size in turn), no neighbour: the reference R;
- `spells, in rounds`: the same beside a neighbour process on the same core, busy for a random 0.05-0.4 s, then
  idle for a random 0.05-0.4 s (seeded), as a shared host's other work comes and goes;
- `spells, one after other`: the same neighbour; each batch size timed in a block of its own (one kernel call per
  batch size), as the kernel timed before 2026-12-06.
Per kind: the median R, its range, and its spread as a geometric standard deviation (exp of the standard deviation
of log R over the calibrations); then the two orders' spreads as a ratio. Pinning both processes to core 0 needs
sched_setaffinity (Linux); without it the script says so and the neighbour shares whatever the scheduler gives.

    python benchmarks/layer_timing_order.py --model resnet8 --dataset cifar10 --batches 8 16 --calibrations 8
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import signal
import statistics
import subprocess
import sys

import torch

from ddlbench.catalog import MODELS
from ddlbench.train.calibration.layer_timing_kernel import run_layer_timings
from ddlbench.train.calibration.point import CalibrationPoint

NEIGHBOUR = """
import random, time
rng = random.Random({seed})
while True:
    end = time.perf_counter() + rng.uniform(0.05, 0.4)
    while time.perf_counter() < end:
        pass
    time.sleep(rng.uniform(0.05, 0.4))
"""


def ratio(point: CalibrationPoint, small: int, large: int, in_rounds: bool) -> float:
    """R of one calibration: in rounds (one kernel call over both batch sizes) or one batch size after the other."""
    cpu = torch.device("cpu")
    if in_rounds:
        entries = run_layer_timings(point, cpu)
    else:
        entries = [
            entry
            for batch in (small, large)
            for entry in run_layer_timings(dataclasses.replace(point, batch_sizes=(batch,)), cpu)
        ]
    median = {entry["batch_size"]: statistics.median(entry["step_s"]) for entry in entries}
    return median[small] / median[large]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet8", choices=MODELS.names())
    parser.add_argument("--dataset", default="cifar10")
    parser.add_argument("--batches", nargs=2, type=int, default=[8, 16], metavar=("SMALL", "LARGE"))
    parser.add_argument("--calibrations", type=int, default=8, help="of each kind")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=12, help="timed steps per batch size (the fixture's: 12)")
    parser.add_argument("--seed", type=int, default=0, help="the neighbour's spells")
    args = parser.parse_args()
    small, large = sorted(args.batches)
    if small == large or small < 1:
        parser.error(f"--batches {args.batches}: two different batch sizes ≥ 1")
    torch.set_num_threads(1)
    pinned = hasattr(os, "sched_setaffinity")
    if pinned:
        os.sched_setaffinity(0, {0})
    point = CalibrationPoint(suite="order", benchmark="layer_timings", backend="", nodes=1, ranks_per_node=1,
                             threads=1, warmup=args.warmup, iterations=args.iterations, timeout_s=600.0,
                             precisions=("fp32",), model=args.model, dataset=args.dataset,
                             batch_sizes=(small, large))  # fmt: skip
    ratio(point, small, large, True)  # the first calibration builds caches and allocator pools: untimed

    kinds = {"quiet, in rounds": [], "spells, in rounds": [], "spells, one after other": []}
    neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR.format(seed=args.seed)])
    try:
        if pinned:
            os.sched_setaffinity(neighbour.pid, {0})
        for _ in range(args.calibrations):
            neighbour.send_signal(signal.SIGSTOP)
            kinds["quiet, in rounds"].append(ratio(point, small, large, True))
            neighbour.send_signal(signal.SIGCONT)
            kinds["spells, in rounds"].append(ratio(point, small, large, True))
            kinds["spells, one after other"].append(ratio(point, small, large, False))
    finally:
        neighbour.kill()
        neighbour.wait()

    print(
        f"{args.model} on {args.dataset}, batches {small} and {large}, {args.iterations} timed steps each, 1 thread"
        f"{', pinned with its neighbour to core 0' if pinned else ', unpinned (no sched_setaffinity)'}"
    )
    print(f"R = median step at batch {small} ÷ at batch {large}, one per calibration; spread = exp(sd of log R)")
    spreads = {}
    for name, values in kinds.items():
        spreads[name] = math.exp(statistics.stdev(math.log(v) for v in values)) if len(values) > 1 else math.nan
        print(f"{name:<24} R median {statistics.median(values):.3f} (range {min(values):.3f}-{max(values):.3f} "
              f"over {len(values)}), spread ×{spreads[name]:.3f}")  # fmt: skip
    rounds, blocks = math.log(spreads["spells, in rounds"]), math.log(spreads["spells, one after other"])
    print(f"spread of log R, one after other ÷ in rounds: ×{blocks / rounds if rounds > 0 else math.inf:.2f}")


if __name__ == "__main__":
    main()
