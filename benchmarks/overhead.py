"""How much throughput does ddlbench's kernel give up against a bare hand-written DDP loop?

Runs the same training job three ways, in rotation (ddlbench, traced, bare, ddlbench, …) for --pairs
rounds, and prints the global samples/s of every run, the median of each side (with a nonparametric
95 % confidence interval of the median from 6 rounds on), the ratios of the medians to bare and the
median of the per-round ratios. The target is a ratio ≥ 0.98; it is printed, never asserted.

Both sides train the same job: model --model on synthetic cifar10, strategy ddp, 1 node × --ranks
ranks, --batch samples per rank, --threads intra-op threads per rank, --warmup unmeasured steps then
--steps measured ones, seed 0, SGD(lr 0.05, momentum 0.9), cross-entropy. Same initial weights
(`ddlbench.train.kernel.build_model`) and same batches (`step_batches`, rank r's samples
[r·batch, (r+1)·batch) of each global batch).

  ddlbench  the path a sweep takes: `ddlbench.launch.runner.run_point(point, out=record,
            launcher="local")` in this process. It claims free cores and pins each rank to its own
            (when enough are free), starts one `python -m ddlbench.launch.worker` per rank (file://
            rendezvous), and each rank runs `train_point`: DDP (bucket 25 MB, no initial broadcast),
            a clock-offset estimate, warm-up steps (the last under the memory probe), a barrier, then
            the measured steps, each stamped start and end.
  traced    the same as ddlbench with tracing on (`trace_steps` = --steps): every measured step's
            timeline is exported after the window as a Chrome/Perfetto trace beside the record. The
            phases and collectives are stamped in every step on both ddlbench sides (DDP's buckets
            through a communication hook); tracing only decides what is written afterwards.
  bare      benchmarks/bare_ddp.py, one plain `python` process per rank started here: plain
            DistributedDataParallel with its defaults, warm-up steps, a barrier, the measured steps.

The same window on both sides: global batch × measured steps / (end of the last measured step on the
latest rank − start of the first measured step on the earliest rank), every measured step counted, on one
clock (ddlbench maps its ranks' stamps onto rank 0's; the bare ranks' perf_counter is the host's
CLOCK_MONOTONIC). ddlbench's own figure, `metrics.samples_per_s_overall`, leaves out leading steps it
judges still warming up: it is shown beside ("its figure", with the steps it dropped), not compared.
Neither figure counts launch, imports or teardown ("launch→end" shows each run's whole wall time).

The same settings on both sides, so that the ratio is ddlbench's own cost and nothing else:
- threads: OMP_NUM_THREADS = MKL_NUM_THREADS = --threads in every rank's environment, and
  torch.set_num_threads(--threads) in every rank (ddlbench's worker and bare_ddp.py both call it);
- CPU placement: each bare rank is pinned to the CPUs the ddlbench rank of the same number had in that
  round (ddlbench pins a rank to cores of its own when enough are free; when it did not, neither does
  bare); --pin-bare pins bare rank r to the r-th --threads CPUs of the affinity whatever ddlbench did;
- the allocator (--malloc, default fixed): glibc's malloc moves its mmap and trim thresholds with what a
  process has allocated and freed so far, so how often a step's tensors are mapped fresh and handed back
  to the kernel (their pages faulted in and zeroed again the next step) depends on the process's history,
  not on its loop. A ddlbench rank runs torch.profiler (its memory probe) from before the model is built
  to the last warm-up step, and leaves the window with fewer faults than a plain loop. Found by changing
  one thing at a time in the bare loop (resnet8, batch 32, 2 ranks pinned on a 2-vCPU host, 30 steps,
  4 rounds each; medians): as it was, ddlbench/bare 1.055-1.063 with 143-156k minor faults and 0.36-0.38 s
  of kernel time per bare rank; with torch.profiler over its model build and warm-up (nothing else
  changed), 1.010 and 95k faults, 0.23 s; set_num_threads, DDP's init_sync, a Python communication hook
  like ddlbench's and a clock exchange like ddlbench's changed neither. With `fixed`, every rank of both
  sides gets GLIBC_TUNABLES=glibc.malloc.mmap_threshold=32 MiB (glibc's own ceiling for the moving
  threshold) and glibc.malloc.trim_threshold=256 MiB (above these jobs' step footprint): no side maps a
  step's tensors fresh or gives freed memory back between steps (1-7k faults per rank), and ddlbench/bare
  was 0.996 (per-round median 1.000, range 0.954-1.013); `default` (each process as it comes) 1.048.
  The issue's 1.215 was on a host whose steps were about 4x shorter (34 ms against 130 here), where the
  same kernel time per step would be a larger share. (Where the C library is not glibc, the setting is inert.)
What stays ddlbench's own, and so is measured: its worker and launch, the DDP communication hook and
the stamps of phases and collectives in every step, the clock-offset estimate, the memory probe.

Each run's first and last loss are printed: the two sides should agree, or they did not do the same work.
Timings on a shared 2-core machine vary by tens of percent from run to run; only figures within one
invocation compare, and a ratio means little without the interval (--pairs 6 or more).

    make bench-overhead                     # = .venv/bin/python benchmarks/overhead.py $(OVERHEAD_ARGS)
    .venv/bin/python benchmarks/overhead.py --pairs 3 --steps 20
    .venv/bin/python benchmarks/overhead.py --model resnet20 --pairs 8 --steps 40
    .venv/bin/python benchmarks/overhead.py --malloc default     # each side's allocator as it comes
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ddlbench.catalog import MODELS
from ddlbench.launch.runner import run_point
from ddlbench.point import Point
from ddlbench.records import read_record
from ddlbench.statistics import median_ci

BARE_SCRIPT = Path(__file__).resolve().with_name("bare_ddp.py")
DATASET = "cifar10"
TARGET_RATIO = 0.98
TIMEOUT_S = 600.0
LOG_TAIL_CHARS = 3000
# --malloc fixed: glibc's thresholds, the same in every rank of both sides (the module docstring says why)
MALLOC_TUNABLES = {"glibc.malloc.mmap_threshold": 32 * 2**20, "glibc.malloc.trim_threshold": 256 * 2**20}


@dataclass(frozen=True, kw_only=True)
class Run:
    """One launch of one side."""

    side: str  # "ddlbench", "traced" or "bare"
    samples_per_s: float  # global samples/s over every measured step, the same window on each side (docstring)
    window_s: float
    launch_s: float  # wall time from starting the ranks to all of them ending
    loss_first: float  # mean over ranks, first warm-up step
    loss_last: float  # mean over ranks, last measured step
    note: str
    pinned: tuple[frozenset[int], ...] | None = None  # ddlbench: each rank's CPUs, where it pinned them


def build_point(args: argparse.Namespace) -> Point:
    cpus = len(os.sched_getaffinity(0))
    return Point(
        model=args.model,
        dataset=DATASET,
        strategy="ddp",
        nodes=1,
        ranks_per_node=args.ranks,
        batch_size=args.batch,
        threads=args.threads,
        repetition=0,
        warmup_steps=args.warmup,
        steps=args.steps,
        seed=0,
        learning_rate=0.05,
        precision=args.precision,
        timeout_s=TIMEOUT_S,
        # ddlbench refuses to share cores unless told; the bare side shares them anyway, so allow it
        oversubscribe=args.ranks * args.threads > cpus,
    )


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (file descriptors, so the ranks' too) into `log`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "ab") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def fail(what: str, log: Path) -> None:
    tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if log.exists() else ""
    sys.exit(f"overhead: {what}\n--- end of {log} ---\n{tail}")


def run_ddlbench(point: Point, work: Path, *, side: str = "ddlbench") -> Run:
    record_path = work / "record.json"
    log = work / "ddlbench.log"
    began = time.perf_counter()
    with output_to(log):
        run_point(point, out=record_path, launcher="local")
    launch_s = time.perf_counter() - began
    record = read_record(record_path)
    metrics = record.metrics
    if record.status != "ok" or metrics is None:
        fail(f"the ddlbench run ended {record.status}: {record.reason}", log)
    # every measured step, from the earliest rank's first start to the latest rank's last end (rank 0's clock)
    first = min(rank.step_starts_s[0] for rank in record.ranks)
    last = max(rank.step_ends_s[-1] for rank in record.ranks)
    ranks = sorted(record.ranks, key=lambda rank: rank.rank)
    cpus = "; ".join(",".join(map(str, rank.cpus)) for rank in ranks)
    bindings = "; ".join(sorted({rank.cpu_binding or "none" for rank in ranks}))
    pinned = tuple(frozenset(rank.cpus) for rank in ranks) if all(rank.cpu_binding for rank in ranks) else None
    note = (
        f"its figure {metrics.samples_per_s_overall:.1f}/s (dropped {metrics.warmup_dropped_steps} steps), "
        f"cpus: {cpus} (binding: {bindings}){', oversubscribed' if metrics.oversubscribed else ''}"
    )
    if point.trace_steps:
        trace = record_path.with_suffix(".trace.json")
        note += f", trace {trace.stat().st_size / 1024:.0f} KiB" if trace.exists() else ", no trace written"
    return Run(
        side=side,
        samples_per_s=metrics.global_batch_size * point.steps / (last - first),
        window_s=last - first,
        launch_s=launch_s,
        loss_first=metrics.loss_first,
        loss_last=metrics.loss_last,
        note=note,
        pinned=pinned,
    )


def bare_placement(point: Point, ddlbench: Run, *, force: bool) -> list[frozenset[int] | None]:
    """Each bare rank's CPUs: the same rank's of the ddlbench run before it (none where it pinned none),
    or with `force` (--pin-bare) the r-th --threads CPUs of this process's affinity."""
    if force:
        allowed = sorted(os.sched_getaffinity(0))
        return [
            frozenset(allowed[rank * point.threads : (rank + 1) * point.threads]) or None
            for rank in range(point.world_size)
        ]
    return list(ddlbench.pinned) if ddlbench.pinned else [None] * point.world_size


def run_bare(point: Point, work: Path, *, device: str, placement: list[frozenset[int] | None]) -> Run:
    log = work / "bare.log"
    rendezvous = work / "rendezvous"
    env = {**os.environ, "OMP_NUM_THREADS": str(point.threads), "MKL_NUM_THREADS": str(point.threads)}
    processes = []
    began = time.perf_counter()
    with open(log, "ab") as sink:
        for rank in range(point.world_size):
            cpus = placement[rank]
            command = [
                sys.executable,
                str(BARE_SCRIPT),
                "--spec",
                point.to_json(),
                "--rank",
                str(rank),
                "--world-size",
                str(point.world_size),
                "--init-method",
                f"file://{rendezvous}",
                "--device",
                device,
                "--out",
                str(work),
            ]
            pin_rank = (lambda cpus=cpus: os.sched_setaffinity(0, cpus)) if cpus else None
            process = subprocess.Popen(command, env=env, stdout=sink, stderr=sink, preexec_fn=pin_rank)
            processes.append(process)
        codes = []
        for process in processes:
            try:
                codes.append(process.wait(timeout=max(1.0, TIMEOUT_S - (time.perf_counter() - began))))
            except subprocess.TimeoutExpired:
                for other in processes:
                    other.kill()
                fail(f"the bare run passed its {TIMEOUT_S:g} s limit", log)
    launch_s = time.perf_counter() - began
    files = [work / f"bare-rank-{rank}.json" for rank in range(point.world_size)]
    if not all(file.exists() for file in files):
        fail(f"a bare rank wrote no result (exit codes {codes})", log)
    # every rank wrote its result before leaving, so a late abort in teardown does not spoil the figures
    results = [json.loads(file.read_text()) for file in files]
    # the same window as ddlbench's: every rank's perf_counter is this host's CLOCK_MONOTONIC
    window_s = max(result["window_end_s"] for result in results) - min(result["window_start_s"] for result in results)
    faults = ", ".join(f"{result['minor_page_faults'] / point.steps:.0f}" for result in results)
    cpus = "; ".join(",".join(map(str, result["cpus"])) for result in results)
    pinned = "pinned as ddlbench's ranks" if any(placement) else "unpinned, as ddlbench's ranks"
    note = f"minor page faults per step by rank {faults}, cpus: {cpus} ({pinned})"
    if any(codes):
        note += f", exit codes {codes} after writing results"
    return Run(
        side="bare",
        samples_per_s=point.global_batch_size * point.steps / window_s,
        window_s=window_s,
        launch_s=launch_s,
        loss_first=statistics.fmean(result["losses"][0] for result in results),
        loss_last=statistics.fmean(result["losses"][-1] for result in results),
        note=note,
    )


def malloc_tunables(current: str) -> str:
    """GLIBC_TUNABLES with MALLOC_TUNABLES set, the caller's other tunables kept."""
    kept = [item for item in current.split(":") if item and item.split("=")[0] not in MALLOC_TUNABLES]
    return ":".join([*kept, *(f"{name}={value}" for name, value in MALLOC_TUNABLES.items())])


def describe_machine(point: Point, device: str) -> list[str]:
    allowed = sorted(os.sched_getaffinity(0))
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    lines = [
        f"machine: {platform.node()}, {os.cpu_count()} CPUs, affinity {allowed} ({len(allowed)}), load {load}",
        f"python {platform.python_version()}, device {device}",
        f"job: {point.model} on synthetic {point.dataset}, ddp, {point.world_size} ranks × {point.threads} "
        f"thread(s), batch {point.batch_size}/rank (global {point.global_batch_size}), "
        f"{point.warmup_steps} warm-up + {point.steps} measured steps, precision {point.precision} on both sides",
    ]
    if len(allowed) <= 2 or point.world_size * point.threads > len(allowed):
        lines.append(
            f"warning: {len(allowed)} CPUs for {point.world_size * point.threads} rank threads, likely shared with "
            "other work: runs vary by tens of percent, so trust the interval and the per-pair ratios, not one run"
        )
    return lines


def summarize(label: str, values: list[float]) -> str:
    ordered = sorted(values)
    median = statistics.median(ordered)
    ci = median_ci(ordered)
    interval = f"95 % CI of the median [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else f"no CI (n = {len(ordered)} ≤ 5)"
    return f"  {label:<9} median {median:8.1f} samples/s   {interval}   range {ordered[0]:.1f}–{ordered[-1]:.1f}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet8", help="an image model of the catalog (default resnet8)")
    parser.add_argument("--ranks", type=int, default=2, help="ranks on this host (default 2)")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank per step (default 32)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (default 1)")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps first (default 3)")
    parser.add_argument("--steps", type=int, default=30, help="measured steps per run (default 30)")
    parser.add_argument("--pairs", type=int, default=5, help="rounds of ddlbench, traced, bare (default 5)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu (gloo) or cuda (NCCL)")
    parser.add_argument(
        "--precision",
        choices=("fp32", "tf32", "bf16"),
        default="fp32",
        help="the arithmetic of both sides, as ddlbench's precision (default fp32: TF32 off, not torch's defaults)",
    )
    parser.add_argument(
        "--sides",
        default="ddlbench,traced,bare",
        help="which sides run, comma-separated, bare always among them (default ddlbench,traced,bare)",
    )
    parser.add_argument(
        "--pin-bare", action="store_true", help="pin bare rank r to the r-th CPUs even where ddlbench pinned none"
    )
    parser.add_argument(
        "--malloc",
        choices=("fixed", "default"),
        default="fixed",
        help="glibc malloc thresholds fixed alike on both sides (default), or as each process has them",
    )
    args = parser.parse_args()
    cnns = [name for name in MODELS.names() if MODELS.get(name).input_kind == "image2d"]
    if args.model not in cnns:
        parser.error(f"--model {args.model!r} is not an image model of the catalog; known: {', '.join(cnns)}")
    args.sides = tuple(side.strip() for side in args.sides.split(",") if side.strip())
    if "bare" not in args.sides or not set(args.sides) <= {"ddlbench", "traced", "bare"} or len(args.sides) < 2:
        parser.error(f"--sides {','.join(args.sides)!r}: bare and one or both of ddlbench, traced")
    if "traced" in args.sides and "ddlbench" not in args.sides:
        parser.error("--sides: traced is compared with ddlbench too; name ddlbench")
    if min(args.ranks, args.batch, args.threads, args.warmup, args.steps, args.pairs) < 1:
        parser.error("--ranks, --batch, --threads, --warmup, --steps and --pairs must be ≥ 1")
    return args


def main() -> None:
    args = parse_args()
    if args.device == "cpu":
        # ddlbench's worker takes a GPU whenever it sees one; hide them so both sides run on CPU
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    else:
        import torch

        if torch.cuda.device_count() < args.ranks:
            sys.exit(f"overhead: --device cuda needs {args.ranks} GPUs, this host has {torch.cuda.device_count()}")
    logging.basicConfig(level=logging.WARNING)
    if args.malloc == "fixed":  # inherited by every rank of both sides (ddlbench's launcher passes os.environ on)
        os.environ["GLIBC_TUNABLES"] = malloc_tunables(os.environ.get("GLIBC_TUNABLES", ""))
    point = build_point(args)
    print("\n".join(describe_machine(point, args.device)), flush=True)
    print(f"allocator: {args.malloc} (GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r})", flush=True)

    runs: dict[str, list[Run]] = {side: [] for side in ("ddlbench", "traced", "bare") if side in args.sides}
    traced = dataclasses.replace(point, trace_steps=point.steps)
    with tempfile.TemporaryDirectory(prefix="ddlbench-overhead-") as tmp:
        for pair in range(1, args.pairs + 1):
            for side in runs:
                work = Path(tmp) / f"pair{pair}-{side}"
                work.mkdir()
                if side == "ddlbench":
                    run = run_ddlbench(point, work)
                elif side == "traced":
                    run = run_ddlbench(traced, work, side="traced")
                else:
                    placement = bare_placement(point, runs["ddlbench"][-1], force=args.pin_bare)
                    run = run_bare(point, work, device=args.device, placement=placement)
                runs[side].append(run)
                print(
                    f"round {pair:>2}  {side:<8} {run.samples_per_s:8.1f} samples/s  window {run.window_s:6.3f} s  "
                    f"launch→end {run.launch_s:5.1f} s  loss {run.loss_first:.4f}→{run.loss_last:.4f}  {run.note}",
                    flush=True,
                )

    figures = {side: [run.samples_per_s for run in side_runs] for side, side_runs in runs.items()}
    print(f"\nglobal samples/s over the measured window, {args.pairs} round(s):")
    for side, values in figures.items():
        print(summarize(side, values))
    for side, base in (("ddlbench", "bare"), ("traced", "bare"), ("traced", "ddlbench")):
        if side not in figures or base not in figures:
            continue
        ratio = statistics.median(figures[side]) / statistics.median(figures[base])
        pair_ratios = sorted(a / b for a, b in zip(figures[side], figures[base], strict=True))
        met = "met" if ratio >= TARGET_RATIO else "not met"
        target = f"  (target ≥ {TARGET_RATIO}: {met})" if base == "bare" else ""
        print(
            f"  {side}/{base}: ratio of medians {ratio:.3f}{target}; per-round ratios median "
            f"{statistics.median(pair_ratios):.3f}, range {pair_ratios[0]:.3f}–{pair_ratios[-1]:.3f}"
        )
    gap = max(abs(a.loss_last - b.loss_last) for a, b in zip(runs["ddlbench"], runs["bare"], strict=True))
    if gap > 1e-3 * max(1.0, abs(runs["bare"][0].loss_last)):
        print(f"  warning: last losses differ by up to {gap:.2g} between the sides: they may not train the same thing")


if __name__ == "__main__":
    main()
