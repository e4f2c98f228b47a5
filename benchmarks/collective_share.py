"""gloo's collectives between two ranks of this host, one core each: their cost per byte by size, the CPU they
burn, and how much of the rank's core they take while the rank computes.

The analytic model prices a collective from the calibration's fit (α + β·S, timed at `message_bytes`: up to 4 MiB
in the benchmark's suite until this benchmark showed the slope 20-25 % high at a bucket's size, 64 MiB since)
and slows the compute a collective overlaps by the share of the rank's cores the calibration measured it to take
(its `beside` mode, ddlbench.analysis.analytic.layout.Context.comm_share; before it, where no core was left over
for communication, it added it to the compute unhidden). This prints what both rest on, per size S:
- `alone`: the collective with both ranks waiting on it, in ms and ns/B (median of --rounds; the rounds' range
  ends the line, beside the range of each round's both ÷ serial), and `cpu`: the rank process's CPU seconds
  over those wall seconds (its calling thread blocks in the wait, so that is gloo's own threads' share of a
  core: what a collective takes from the rank's compute when both want the core);
- `beside`: the collective started asynchronously, then --work of the rank's own compute (a chain of 512² matmuls
  or passes over a 128 MiB buffer, each timed alone too), then its wait: the compute's stretch, the share of the
  core the collective took while the compute ran (stretch ÷ the collective alone) and the end of both against
  the end of the two one after the other (`serial`).

Each rank is its own process, pinned to its core, started with the retain allocator's variables (ddlbench.launch.
command.RETAIN_ENV), as the analytic benchmark's ranks. Nothing else should run beside it.

    python benchmarks/collective_share.py --sizes-mib 1 4 16 64 256 --rounds 3 --op all_reduce

`--op` reduce_scatter and all_gather take S as the whole (the bucket: the reduce-scatter's input, the all-gather's
output), as zero2 issues them and the calibration's fits count them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

RANKS = 2


def rank_main(rank: int, port: int, sizes_mib: list[int], rounds: int, work: str, op: str) -> None:
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS)
    left, right = torch.randn(512, 512), torch.randn(512, 512)
    buffer = torch.randn(32 * 2**20)

    def compute() -> None:
        if work == "matmul":
            for _ in range(60):
                torch.mm(left, right)
        else:
            for _ in range(4):
                buffer.mul_(1.0000001)

    def timed(run) -> float:
        dist.barrier()
        began = time.perf_counter()
        run()
        return time.perf_counter() - began

    for size in sizes_mib:
        values = torch.ones(size * 2**20 // 4)
        part = torch.ones(values.numel() // RANKS)

        def collective(async_op: bool = False, values=values, part=part):
            if op == "all_reduce":
                return dist.all_reduce(values, async_op=async_op)
            if op == "reduce_scatter":
                return dist.reduce_scatter_tensor(part, values, async_op=async_op)
            return dist.all_gather_into_tensor(values, part, async_op=async_op)

        collective()  # its buffers taken once before any timing
        rows, shares = [], []
        for _ in range(rounds):
            alone_compute = timed(compute)
            cpu_before = time.process_time()
            alone_reduce = timed(collective)
            shares.append((time.process_time() - cpu_before) / alone_reduce)
            dist.barrier()
            began = time.perf_counter()
            handle = collective(async_op=True)
            compute()
            beside_compute = time.perf_counter() - began
            handle.wait()
            rows.append((alone_compute, alone_reduce, beside_compute, time.perf_counter() - began))
        if rank == 0:
            compute_s, reduce_s, beside_s, both_s = (statistics.median(row[k] for row in rows) for k in range(4))
            stretch = beside_s - compute_s
            ratios = [both / (compute + reduce) for compute, reduce, _, both in rows]  # each round's own
            print(
                f"{size:5d} MiB  alone {reduce_s * 1e3:8.1f} ms {reduce_s / (size * 2**20) * 1e9:5.2f} ns/B "
                f"cpu {statistics.median(shares):4.2f}   "
                f"beside {work} of {compute_s * 1e3:6.1f} ms: stretched {stretch * 1e3:+7.1f} ms, "
                f"share {stretch / reduce_s:4.2f}; both done {both_s * 1e3:7.1f} ms, serial "
                f"{(compute_s + reduce_s) * 1e3:7.1f} ms (×{both_s / (compute_s + reduce_s):.2f}); over the "
                f"{len(rows)} rounds: alone {min(r[1] for r in rows) * 1e3:.1f}-"
                f"{max(r[1] for r in rows) * 1e3:.1f} ms, both ÷ serial {min(ratios):.2f}-{max(ratios):.2f}",
                flush=True,
            )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    parser.add_argument("--rounds", type=int, default=3, help="each figure is the median of these")
    parser.add_argument("--work", choices=("matmul", "pass"), default="matmul")
    parser.add_argument("--op", choices=("all_reduce", "reduce_scatter", "all_gather"), default="all_reduce")
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.sizes_mib, args.rounds, args.work, args.op)
        return
    from ddlbench.launch.command import RETAIN_ENV
    from ddlbench.launch.rendezvous import mpi_master_port

    # free and outside the ephemeral range, where a port from bind(0) could be taken before rank 0's store binds it
    port = mpi_master_port()
    env = {**os.environ, **RETAIN_ENV, "OMP_NUM_THREADS": "1"}
    print(
        f"gloo {args.op}, {RANKS} ranks of this host, one core each, retain allocator; median of {args.rounds} "
        f"rounds; share = the compute's stretch ÷ the collective alone; cpu = the rank's CPU ÷ wall seconds alone",
        flush=True,
    )
    began = time.monotonic()
    forwarded = ["--sizes-mib", *map(str, args.sizes_mib), "--rounds", str(args.rounds), "--work", args.work]
    forwarded += ["--op", args.op]
    ranks = [
        subprocess.Popen([sys.executable, __file__, *forwarded, "--rank", str(rank), "--port", str(port)], env=env)
        for rank in range(RANKS)
    ]
    codes = [rank.wait(timeout=1800) for rank in ranks]
    if any(codes):
        raise SystemExit(f"a rank failed: exit codes {codes}")
    print(f"done in {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
