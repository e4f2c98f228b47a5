"""The host's speed at a moment: three short fixed kernels, timed the same way in every training point and in
every calibration point (imported by the worker only: it needs torch).

A calibration is a sample of the host at the minutes it ran in. On a shared or throttling host those minutes
can differ from a later point's by more than anything the model does (on the 2-core development machine a
calibration taken in a slow spell costed gloo's all-reduce at 2.6-4.4 ms a call where, 20 minutes later, it
took 0.18-0.24 ms, and every operator at 1.2× its later time: docs/analytic.md, the eighth scoring set). The
probe puts a figure on it, so a record says how fast its host was while it ran, against the calibration's
own probe (ddlbench.analysis.machine.host_speed):

- compute_s: one forward and backward of a 3×3 convolution, 32 → 32 channels on 32×32 maps at 4 samples
  (226 MFLOP with both gradients): after WARMUP untimed calls, BLOCKS blocks of back-to-back calls, each block
  at least BLOCK_S long; the median over blocks of a block's time ÷ its calls (seconds a call);
- copy_s: one copy of COPY_ELEMENTS fp32 elements (16 MiB read, 16 MiB written), timed the same way (seconds);
- all_reduce_s: ALL_REDUCE_CALLS one-element all-reduces back to back over every rank of the job, after a
  barrier, their wall time ÷ ALL_REDUCE_CALLS (seconds; a mean, not a median: gloo's calls on a shared CPU
  take 0.05-0.2 ms or 2-4 ms, and the share of slow ones is what drifts); None with one rank.

Why blocks and not single calls: a call takes about 2 ms on a CPU core, shorter than Linux's scheduler
slice (0.75 ms × (1 + log2 of the CPUs, counted up to 8): 3 ms on 8 CPUs or more), so on a core shared with
another busy process most single calls run whole inside one of the probe's slices and their median reads the
core's speed, not the probe's share of it (PROBE_VERSION 1 did that: a CI machine read a core shared with a
busy process at 0.8× the core alone). A block spans several slices, as a training step does, and reads the
share.

Every rank probes at once (a point's ranks share their host while training too); the calibration probes in
turn, rank 0 alone and then all its ranks (`turn` alone, then all), so a point is set against the probe of as
many ranks sharing a host as it had. fp32 with TF32 off on CUDA (the switches restored after), on the rank's
threads; inputs from a fixed seed. About 0.16 s on one CPU core; 0.5 s the first time in a process (its first
convolution builds oneDNN's primitive: 0.2 s). On a GPU the convolution takes tens of microseconds, so
compute_s there mostly measures the host issuing its kernels, which is what a GPU's small layers wait on too.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

PROBE_VERSION = 2  # 1: the median of 9 single calls (blind to time-slicing, see above)
CONV_SHAPE = (4, 32, 32, 32)  # samples, channels (in = out), height, width; a 3×3 kernel, padding 1
COPY_ELEMENTS = 4 * 2**20  # fp32: 16 MiB
BLOCKS = 5
BLOCK_S = 0.015  # seconds; a block spans several scheduler slices
WARMUP = 5  # oneDNN makes its primitive on the first call (0.2 s) and the next few run up to 1.3x slow
ALL_REDUCE_CALLS = 20
SEED = 0


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_per_call(call, device: torch.device) -> float:
    """The median over BLOCKS blocks of a block's wall time ÷ its calls; a block has as many calls as the last
    warm-up call says fill BLOCK_S (at least one). Synchronised after every call, as a step's layers are."""
    for _ in range(WARMUP - 1):
        call()
    _synchronize(device)
    began = time.perf_counter()
    call()
    _synchronize(device)
    calls = max(1, math.ceil(BLOCK_S / max(time.perf_counter() - began, 1e-9)))
    times = []
    for _ in range(BLOCKS):
        began = time.perf_counter()
        for _ in range(calls):
            call()
            _synchronize(device)
        times.append((time.perf_counter() - began) / calls)
    return statistics.median(times)


def probe_host(device: torch.device, *, all_reduce: bool) -> dict[str, Any]:
    """The three figures of the module docstring on this rank; `all_reduce`: whether every rank of the default
    group calls this now (the one-element all-reduces need them all)."""
    generator = torch.Generator().manual_seed(SEED)
    n, c, h, w = CONV_SHAPE
    x = torch.randn(n, c, h, w, generator=generator).to(device).requires_grad_()
    weight = torch.randn(c, c, 3, 3, generator=generator).mul_(0.05).to(device).requires_grad_()
    grad = torch.randn(n, c, h, w, generator=generator).to(device)
    source = torch.empty(COPY_ELEMENTS, device=device).fill_(1.0)  # a copy's speed owes nothing to its values
    target = torch.empty_like(source)
    on_cuda = device.type == "cuda"
    switches = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) if on_cuda else None
    if on_cuda:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False

    def conv() -> None:
        x.grad = weight.grad = None
        F.conv2d(x, weight, padding=1).backward(grad)

    try:
        compute_s = time_per_call(conv, device)
        copy_s = time_per_call(lambda: target.copy_(source), device)
    finally:
        if switches is not None:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = switches
    all_reduce_s = None
    if all_reduce and dist.is_initialized() and dist.get_world_size() > 1:
        one = torch.zeros(1, device=device)
        dist.barrier()
        began = time.perf_counter()
        for _ in range(ALL_REDUCE_CALLS):
            dist.all_reduce(one)
        _synchronize(device)
        all_reduce_s = (time.perf_counter() - began) / ALL_REDUCE_CALLS
    return {
        "probe_version": PROBE_VERSION,
        "compute_s": compute_s,
        "copy_s": copy_s,
        "all_reduce_s": all_reduce_s,
        "threads": torch.get_num_threads(),
        "time": time.time(),
    }


def probe_all_at_once(device: torch.device, when: str) -> dict[str, Any]:
    """A training point's probe: every rank at once (after a barrier), tagged `when` (start | end) and `turn`
    all."""
    if dist.is_initialized():
        dist.barrier()
    return probe_host(device, all_reduce=True) | {"when": when, "turn": "all"}


def probe_in_turn(device: torch.device, when: str) -> list[dict[str, Any]]:
    """A calibration point's probes: rank 0 alone (the others idle at the next barrier: `turn` alone), then
    every rank at once with the all-reduces (`turn` all); each entry tagged with its turn and `when`. How many
    ranks shared a host in a turn is counted from the ranks' host names (ddlbench.analysis.machine.host_speed)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [probe_host(device, all_reduce=False) | {"when": when, "turn": "all"}]
    out = []
    dist.barrier()
    if dist.get_rank() == 0:
        out.append(probe_host(device, all_reduce=False) | {"when": when, "turn": "alone"})
    dist.barrier()
    out.append(probe_host(device, all_reduce=True) | {"when": when, "turn": "all"})
    return out
