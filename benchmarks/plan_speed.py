"""How long does it take to plan a large sweep, and how much of that is ddlbench's own doing?

Writes a sweep config of exactly --points points (default 10,000) into a temporary folder and reports
the median wall-clock time, over --repeats runs (default 3), of:

  expand      load_sweep_config + expand_sweep, in process
  expand+ids  the same, plus every point's point_id (the ids name the output paths)
  plan CLI    `ddlbench plan --configfile F --format ids`, end to end as a subprocess
  snakemake   `snakemake -n` on the project's Snakefile (points + report + all)
  trivial     `snakemake -n` on a trivial Snakefile of the same DAG shape: Snakemake's own floor

The goal is ddlbench ≤ 1.3× trivial on 10,000 points. Measured on a 2-vCPU host (median of 3): 1.32×
(12.84 s against 9.72 s) while the Snakefile's target named every record; 1.23× (12.73 s against 10.31 s)
once it names only the missing ones, and those only after the table exists (workflow/rules/common.smk).

Each dry run must plan the expected number of jobs, or the script stops. Outputs go to the temporary
folder (the sweep's results_dir), never to the repository's results/.

    make bench                                              # = .venv/bin/python benchmarks/plan_speed.py
    .venv/bin/python benchmarks/plan_speed.py --points 1000 --repeats 1
    .venv/bin/python benchmarks/plan_speed.py --points 100 --repeats 1    # seconds: what CI runs
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from ddlbench.config import load_sweep_config
from ddlbench.sweep import expand_sweep

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TIMEOUT_S = 900
# Every axis but `nodes` and the repetitions is fixed: 2 models x 2 datasets x 5 ranks x 5 batch sizes; a
# multiple of 500 points has 5 repetitions of each on as many node counts as it takes (10,000: nodes 1-20), a
# smaller sweep (CI's) 1-4 repetitions on one node count.
POINTS_PER_REPETITION = 2 * 2 * 5 * 5
REPETITIONS = 5
POINTS_PER_NODE_VALUE = POINTS_PER_REPETITION * REPETITIONS
RANKS_PER_NODE = [1, 2, 4, 8, 16]
# jobs of each rule besides the points' (one each), in the project's Snakefile and the trivial one
DDLBENCH_JOBS = {"report": 1, "all": 1}
TRIVIAL_JOBS = {"report": 1, "all": 1}

# The same DAG shape as the project's Snakefile (points → report, which finishes the sweep: ddlbench.finish
# → all), each job a plain `touch`: what Snakemake alone costs to plan it.
TRIVIAL_SNAKEFILE = """\
IDS = [f"p{{i}}" for i in range({points})]

rule all:
    input: "out/report.txt"

rule one:
    output: "out/points/{{id}}.txt"
    shell: "touch {{output}}"

rule report:
    input: expand("out/points/{{id}}.txt", id=IDS)
    output: "out/table.txt", "out/models.txt", "out/report.txt"
    shell: "touch {{output}}"
"""


def sweep_config(points: int, results_dir: Path) -> dict[str, object]:
    return {
        "name": "plan-speed",
        "results_dir": str(results_dir),
        "models": ["resnet8", "resnet20"],
        "datasets": ["cifar10", "mnist"],
        "strategies": ["ddp"],
        "nodes": list(range(1, max(1, points // POINTS_PER_NODE_VALUE) + 1)),
        "ranks_per_node": RANKS_PER_NODE,
        "batch_size": [16, 32, 64, 128, 256],
        "threads": [1],
        "repetitions": REPETITIONS if points >= POINTS_PER_NODE_VALUE else points // POINTS_PER_REPETITION,
    }


def median_time(action: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        sys.exit(f"plan_speed: {' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def largest_point_cores(config: dict[str, object]) -> int:
    """The cores of the sweep's largest point, nodes × ranks per node × threads: a dry run runs nothing, but
    the Snakefile's preamble refuses a point whose ranks × threads exceed --cores (locally every "node"
    is a process group on this host: ddlbench.launch.cores.check_plan_cores)."""
    return max(config["nodes"]) * max(config["ranks_per_node"]) * max(config["threads"])


def dry_run(cwd: Path, extra: list[str], expected: dict[str, int], cores: int) -> None:
    """`snakemake -n --cores C` in cwd; stop unless its job stats show exactly the `expected` jobs per rule."""
    output = run([str(BIN / "snakemake"), "-n", "--cores", str(cores), "--quiet", "rules", *extra], cwd)
    counts = {rule: int(count) for rule, count in re.findall(r"^(\w+)\s+(\d+)\s*$", output, flags=re.MULTILINE)}
    if counts != {**expected, "total": sum(expected.values())}:
        sys.exit(f"plan_speed: expected jobs {expected}, dry run said:\n{output[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--points", type=int, default=10_000, help="100, 200, 300, 400 or a multiple of 500 (default 10000)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (default 3)")
    args = parser.parse_args()
    sizes = "100, 200, 300, 400 or a positive multiple of 500"
    small = args.points in range(POINTS_PER_REPETITION, POINTS_PER_NODE_VALUE, POINTS_PER_REPETITION)
    if not (small or (args.points > 0 and args.points % POINTS_PER_NODE_VALUE == 0)):
        parser.error(f"--points {args.points}: accepted {sizes}")
    if args.repeats <= 0:
        parser.error(f"--repeats {args.repeats}: must be at least 1")
    n = args.points

    with tempfile.TemporaryDirectory(prefix="plan-speed-") as tmp:
        tmp_dir = Path(tmp)
        config = tmp_dir / "sweep.yaml"
        sweep = sweep_config(n, tmp_dir / "results")
        config.write_text(yaml.safe_dump(sweep, sort_keys=False))
        cores = largest_point_cores(sweep)  # both dry runs get the same, so Snakemake's share is alike
        trivial = tmp_dir / "trivial"
        trivial.mkdir()
        (trivial / "Snakefile").write_text(TRIVIAL_SNAKEFILE.format(points=n))

        planned = len(expand_sweep(load_sweep_config(config)).points)
        if planned != n:
            sys.exit(f"plan_speed: the config expands to {planned} points, not {n}")

        def expand() -> None:
            expand_sweep(load_sweep_config(config))

        def ids() -> None:
            for point in expand_sweep(load_sweep_config(config)).points:
                _ = point.point_id

        def plan_cli() -> None:
            command = [str(BIN / "ddlbench"), "plan", "--configfile", str(config), "--format", "ids"]
            listed = run(command, REPO)
            if listed.count("\n") < n:
                sys.exit(f"plan_speed: `ddlbench plan` listed fewer than {n} ids")

        figures = {
            "expand": median_time(expand, args.repeats),
            "expand+ids": median_time(ids, args.repeats),
            "plan CLI": median_time(plan_cli, args.repeats),
        }
        # the two dry runs alternate, round by round, so that a busy spell of the host slows both alike;
        # the ratio is the median of the rounds' ratios
        ours, floors = [], []
        for _ in range(args.repeats):
            ours.append(
                median_time(
                    lambda: dry_run(REPO, ["--configfile", str(config)], {"run_point": n, **DDLBENCH_JOBS}, cores), 1
                )
            )
            floors.append(median_time(lambda: dry_run(trivial, [], {"one": n, **TRIVIAL_JOBS}, cores), 1))
        figures["snakemake -n"] = statistics.median(ours)
        figures["trivial -n"] = statistics.median(floors)
        ratios = sorted(a / b for a, b in zip(ours, floors, strict=True))

    print(f"{n} points, median of {args.repeats} run(s), wall-clock seconds")
    for label, seconds in figures.items():
        print(f"  {label:<13} {seconds:8.2f} s   {1000 * seconds / n:7.3f} ms/point")
    ddlbench, floor = figures["snakemake -n"], figures["trivial -n"]
    print(
        f"  ddlbench Snakefile / trivial Snakefile: {statistics.median(ratios):.2f}x (median of {len(ratios)} "
        f"alternating rounds' ratios; range {ratios[0]:.2f}-{ratios[-1]:.2f}; goal <= 1.3)"
    )
    print(f"  ddlbench's extra planning cost: {1000 * (ddlbench - floor) / n:.3f} ms per job")


if __name__ == "__main__":
    main()
