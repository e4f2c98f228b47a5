"""One rank of a bare, hand-written DDP training loop: the baseline that benchmarks/overhead.py holds ddlbench to.

It is what a user would write with plain PyTorch, and nothing more: set the intra-op threads
(`torch.set_num_threads(point.threads)`, as a careful user and ddlbench do), join a process group (gloo
on CPU, NCCL on CUDA), wrap the point's model in DistributedDataParallel with its defaults, build
SGD(lr=point.learning_rate, momentum=0.9), and run the point's warm-up steps and then its measured
steps of zero_grad, forward, cross-entropy, backward, optimizer step. Only the model and the batches
come from ddlbench, so both sides train the same thing: `build_model(point)` (the same initial weights
from the point's seed) and `step_batches(point, ...)` (the same pool of synthetic batches, rank r's
samples [r·batch, (r+1)·batch) of every global batch, step i using pool entry i mod pool size).
What the two sides share beyond that (the environment: threads, CPU placement, the allocator's settings)
overhead.py sets for both, and says why.

The arithmetic is the point's `precision`, as ddlbench runs it (ddlbench.train.execution): `fp32` is
strict FP32 (TF32 off for cuDNN and matmuls), `tf32` is TF32 for both, `bf16` is autocast to bfloat16
around forward and loss. PyTorch's defaults are neither: cuDNN convolutions in TF32, matmuls in FP32.
Left on them, the bare loop ran resnet18's convolutions on tensor cores while ddlbench's fp32 ran them
in FP32, and ddlbench/bare read 0.457 on an H200 (batch 128, 1 rank; 2 rounds, 0.447-0.467): a
difference of arithmetic, not of overhead. With the point's arithmetic on both sides (H200, torch
2.11.0+cu130, 1 rank pinned to 1 CPU thread, 100 measured steps): fp32 0.998 (3 rounds, per round
0.986-0.998), bf16 0.934 (2 rounds, 0.921-0.948), tf32 0.871 (2 rounds, 0.769-0.959). At bf16 and tf32
a step (~10 ms) is bound by the one CPU thread launching kernels, so what ddlbench adds per step (CUDA
events for the step and its phases) shows: about 0.7 ms per step at bf16.

Timing: after warm-up, a barrier; then each rank stamps `time.perf_counter()` just before its first
measured step and after its last (on CUDA after one `torch.cuda.synchronize()`). Losses are kept as
detached tensors and read only after the window. Each rank writes `bare-rank-R.json` (the two stamps,
elapsed seconds, losses, threads, CPU affinity, its minor page faults over the window) into --out.
perf_counter is CLOCK_MONOTONIC, one clock for every process of a host, so overhead.py takes the window
as ddlbench does: from the earliest rank's first step start to the latest rank's last step end.

Gloo ranks can abort in their destructors at interpreter exit (SIGABRT after all work is done), so a
rank ends with barrier + destroy_process_group + os._exit, the pattern of the project's notes.

Started by overhead.py, one process per rank, never by hand:
    python benchmarks/bare_ddp.py --spec POINT_JSON --rank R --world-size W \
        --init-method file:///tmp/rendezvous --out DIR [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from ddlbench.point import Point
from ddlbench.train.kernel import build_model, step_batches


def result_file(out: Path, rank: int) -> Path:
    return out / f"bare-rank-{rank}.json"


def train(point: Point, rank: int, world_size: int, init_method: str, device_kind: str, out: Path) -> None:
    on_cuda = device_kind == "cuda"
    device = torch.device("cuda", rank) if on_cuda else torch.device("cpu")
    if on_cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(point.threads)
    tf32 = point.precision == "tf32"  # ddlbench's fp32 and bf16 keep FP32 matmuls and convolutions strict
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    low = {"bf16": torch.bfloat16}.get(point.precision)
    if point.precision not in ("fp32", "tf32", "bf16"):
        raise SystemExit(f"bare_ddp: precision {point.precision!r} is not one the bare loop runs (fp32, tf32, bf16)")
    dist.init_process_group("nccl" if on_cuda else "gloo", init_method=init_method, rank=rank, world_size=world_size)

    model = DistributedDataParallel(build_model(point).to(device), device_ids=[rank] if on_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=point.learning_rate, momentum=0.9)
    batches = step_batches(point, rank * point.batch_size, (rank + 1) * point.batch_size, device)

    def train_step(step: int) -> torch.Tensor:
        inputs, targets = batches[step % len(batches)]
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=low, enabled=low is not None):
            loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.detach()

    losses = [train_step(step) for step in range(point.warmup_steps)]
    dist.barrier()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    began = time.perf_counter()
    for step in range(point.warmup_steps, point.warmup_steps + point.steps):
        losses.append(train_step(step))
    if on_cuda:
        torch.cuda.synchronize(device)
    ended = time.perf_counter()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults

    result = {
        "rank": rank,
        "window_start_s": began,
        "window_end_s": ended,
        "elapsed_s": ended - began,
        "minor_page_faults": faults,
        "losses": [loss.item() for loss in losses],
        "threads": torch.get_num_threads(),
        "cpus": sorted(os.sched_getaffinity(0)),
    }
    tmp = result_file(out, rank).with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, result_file(out, rank))  # the parent never reads half a file


def leave(code: int, *, meet: bool) -> None:
    """End the rank without running gloo's destructors (they may abort after the work is done)."""
    try:
        if meet and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, help="the point, as the JSON of Point.to_json()")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-method", required=True, help="file://PATH or tcp://HOST:PORT")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", type=Path, required=True, help="folder for bare-rank-R.json")
    args = parser.parse_args()
    try:
        point = Point.from_dict(json.loads(args.spec))
        train(point, args.rank, args.world_size, args.init_method, args.device, args.out)
    except BaseException:
        traceback.print_exc()
        leave(1, meet=False)  # a barrier could wait forever on a peer that failed too
    leave(0, meet=True)


if __name__ == "__main__":
    main()
