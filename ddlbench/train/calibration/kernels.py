"""The microbenchmarks one rank runs for a calibration point (imported by the worker only: it needs torch).

Every measurement is repeated `warmup` times untimed, then `iterations` times each timed alone: on the
CPU by perf_counter around it, on CUDA by events on the current stream around it (read after one
synchronisation at the end). A rank returns its own times; the runner makes figures of them.

compute (one rank):
- matmul n: C = A·B of n×n matrices in the precision's dtype; 2n³ floating-point operations.
- conv [N, C, H, k]: forward of a k×k convolution, C channels in and out, stride 1, 'same' padding, on
  an N×C×H×H input; 2·N·C·C·k²·H² operations (multiply and add per weight per output element).
- copy B: dst.copy_(src) of B bytes of float32; 2B bytes moved (read and write, STREAM's "copy"); none for B = 0.
- update B: the optimizer's step as training runs it (torch.optim.SGD with kernel.MOMENTUM), over B bytes of
  float32 parameters in UPDATE_TENSORS tensors, each with a gradient, the momentum buffers made by an untimed
  first step; its time ÷ the parameter elements is the analytic model's update term (none for B = 0).
- alone_collective op B (CPU, a point of one rank): zero2's reduce_scatter and all_gather of B bytes on a group
  of one, as its trainer calls them, at each of the suite's `alone_collective_bytes` (_alone_collectives).
A precision the device cannot run (tf32 off CUDA Ampere+, fp16 or bf16 where matmul refuses it) is
recorded with the reason instead of times.

collectives (every rank), for each message size S (bytes of float32; elements rounded down to a multiple
of the world size): all_reduce of S; all_gather to S (S/p from each rank); reduce_scatter of S (S/p to each
rank); broadcast of S from rank 0; send_recv: S from rank 0 to the last rank and back, half the round
trip. Each timed iteration starts after a barrier, so it times the collective, not the ranks' skew.
Then (torch on CPUs) the same again in busy mode: each call after a burst of the rank's own matrix
products (about 0.5 ms, then about 4 ms) and no barrier, as a step's ranks reach their collectives, each
call timed on every rank (`mode: busy`, with each burst's seconds): on a shared CPU a call then also
waits for a peer still computing or not yet scheduled, which a barrier hides.
Then (torch on CPUs) the all-reduce, all-gather and reduce-scatter beside compute (`mode: beside`), at each
message size of BESIDE_MIN_BYTES or more (the largest, where none is): per iteration a chain of matrix products
timed alone, the collective timed alone, then the collective started asynchronously, the same chain run while
it progresses, and its wait. The chain's stretch beside the collective ÷ the collective alone is the share of
the rank's cores the collective took from its compute: a rank is pinned to its threads' cores, and gloo's
threads run there too (_beside). A thread of the rank waits on the collective meanwhile and notes when the
wait returns, which times the collective beside the compute too (`call_beside_s`): the cores it shares make it
slower than alone.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ddlbench.train.calibration.point import CalibrationPoint
from ddlbench.train.kernel import MOMENTUM

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Timer:
    """Times one callable per iteration: host clock on CPU, CUDA events on GPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.on_cuda = device.type == "cuda"

    def times(self, fn: Callable[[], Any], *, warmup: int, iterations: int, before: Callable[[], Any] | None = None):
        for _ in range(warmup):
            if before:
                before()
            fn()
        self.sync()
        marks = []
        for _ in range(iterations):
            if before:
                before()
                self.sync()
            if self.on_cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                marks.append((start, end))
            else:
                began = time.perf_counter()
                fn()
                marks.append((began, time.perf_counter()))
        self.sync()
        if self.on_cuda:
            return [start.elapsed_time(end) / 1000.0 for start, end in marks]  # elapsed_time is in ms
        return [end - start for start, end in marks]

    def sync(self) -> None:
        if self.on_cuda:
            torch.cuda.synchronize(self.device)


def run_compute(point: CalibrationPoint, device: torch.device) -> list[dict[str, Any]]:
    timer = Timer(device)
    out: list[dict[str, Any]] = []
    for precision in point.precisions:
        refusal = _refusal(precision, device)
        for n in point.matmul_sizes:
            entry = {"kind": "matmul", "precision": precision, "size": n, "flop": 2 * n**3}
            out.append(entry | _measure(refusal, lambda n=n, p=precision: _matmul(n, p, device), timer, point))
        for shape in point.conv_shapes:
            batch, channels, side, kernel = shape
            flop = 2 * batch * channels * channels * kernel * kernel * side * side
            entry = {"kind": "conv", "precision": precision, "shape": list(shape), "flop": flop}
            out.append(entry | _measure(refusal, lambda s=shape, p=precision: _conv(s, p, device), timer, point))
    if point.memory_bytes:
        elements = max(1, point.memory_bytes // 4)
        src, dst = torch.ones(elements, device=device), torch.empty(elements, device=device)
        times = timer.times(lambda: dst.copy_(src), warmup=point.warmup, iterations=point.iterations)
        out.append({"kind": "copy", "bytes": 2 * elements * 4, "times_s": times})
        del src, dst
        out.append(_optimizer_step(elements, device, timer, point))
        if device.type == "cpu":
            out.append(_first_touch(FIRST_TOUCH_BYTES // 4, timer, point))
            if point.alone_collective_bytes and dist.is_initialized() and dist.get_world_size() == 1:
                out += _alone_collectives(timer, point)
    return out


# the parameters the optimizer step is timed over, in as many tensors: a large model's are 1-50 M elements each
# (gpt_medium's 4 M-element MLP weights, its 51 M-element embedding); 16 of a 64 MiB probe are 1 M elements
UPDATE_TENSORS = 16
UPDATE_LEARNING_RATE = 1e-3  # any small rate: the step is timed, what it leaves in the parameters is never used


def update_probe(elements: int, device: torch.device) -> tuple[torch.optim.Optimizer, int]:
    """The optimizer the `update` probe steps (kernels' docstring): ddlbench's SGD over `elements` parameters in
    UPDATE_TENSORS tensors (fewer when there are fewer elements), each with a gradient, its momentum buffers made
    by a first step; with the count of its tensors."""
    sizes = [elements // UPDATE_TENSORS + (i < elements % UPDATE_TENSORS) for i in range(UPDATE_TENSORS)]
    parameters = [torch.nn.Parameter(torch.zeros(n, device=device)) for n in sizes if n]
    for parameter in parameters:
        parameter.grad = torch.ones_like(parameter)
    optimizer = torch.optim.SGD(parameters, lr=UPDATE_LEARNING_RATE, momentum=MOMENTUM)
    optimizer.step()  # makes the momentum buffers: a training step's later updates find them made
    return optimizer, len(parameters)


def _optimizer_step(elements: int, device: torch.device, timer: Timer, point: CalibrationPoint) -> dict[str, Any]:
    """The optimizer's step as ddlbench trains over `elements` parameters (update_probe): its times, elements and
    tensors."""
    optimizer, tensors = update_probe(elements, device)
    times = timer.times(optimizer.step, warmup=point.warmup, iterations=point.iterations)
    return {"kind": "update", "elements": elements, "tensors": tensors, "times_s": times}


# above glibc's largest mmap threshold (32 MiB on 64-bit): each allocation of it is mapped anew, whatever the
# process allocated and freed before
FIRST_TOUCH_BYTES = 64 << 20


def _first_touch(elements: int, timer: Timer, point: CalibrationPoint) -> dict[str, Any]:
    """Filling a freshly allocated buffer against filling one already touched, alternately: the host's cost
    of memory it has to map and zero first. glibc returns a freed buffer above its mmap threshold (at most
    32 MiB) to the kernel, and trims the heap above twice that threshold, so a step that frees and
    allocates large tensors pays page faults each time: zero2's buffers of a parameter that large
    (ddlbench.analysis.analytic.data_parallel.zero2_buffers_s, compute.mapped_anew_bytes). On CUDA the caching
    allocator keeps its blocks: not measured."""
    kept = torch.empty(elements)
    kept.fill_(1.0)
    fresh_s, kept_s = [], []
    for _ in range(2):  # interleaved halves: a spell of load weighs on both alike
        fresh_s += timer.times(
            lambda: torch.empty(elements).fill_(1.0), warmup=point.warmup, iterations=max(1, point.iterations // 2)
        )
        kept_s += timer.times(lambda: kept.fill_(1.0), warmup=point.warmup, iterations=max(1, point.iterations // 2))
    return {"kind": "first_touch", "bytes": elements * 4, "times_s": fresh_s, "kept_times_s": kept_s}


ALONE_COLLECTIVE_OPS = ("reduce_scatter", "all_gather")


def _alone_collectives(timer: Timer, point: CalibrationPoint) -> list[dict[str, Any]]:
    """zero2's reduce-scatter and all-gather on a group of one rank (ddlbench.train.strategies.sharded), as the
    trainer calls them (async, waited at once): with no peer gloo still flattens the input into a temporary and
    copies the result out, which the collectives' fits, measured over peers, cannot say. Per op and size, its
    times, taken in rounds of one call of each (the order reversed every other round), so a spell of load falls
    on every size alike. CPU only (`timer` is the host clock there)."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    calls: dict[tuple[str, int], Callable[[], Any]] = {}
    for size in point.alone_collective_bytes:
        whole, other = torch.ones(size // 4), torch.empty(size // 4)
        calls[("reduce_scatter", size)] = lambda whole=whole, other=other: scatter(other, whole, async_op=True).wait()
        calls[("all_gather", size)] = lambda whole=whole, other=other: gather(other, whole, async_op=True).wait()
    order = list(calls)
    for call in order:
        timer.times(calls[call], warmup=point.warmup, iterations=0)
    times: dict[tuple[str, int], list[float]] = {call: [] for call in order}
    for index in range(point.iterations):
        for call in order if index % 2 == 0 else reversed(order):
            times[call] += timer.times(calls[call], warmup=0, iterations=1)
    return [
        {"kind": "alone_collective", "op": op, "bytes": size // 4 * 4, "times_s": times[(op, size)]}
        for op, size in order
    ]


def _refusal(precision: str, device: torch.device) -> str | None:
    if precision == "tf32":
        if device.type != "cuda":
            return "tf32 needs a CUDA GPU of compute capability >= 8.0; this rank runs on the CPU"
        if torch.cuda.get_device_capability(device) < (8, 0):
            return f"tf32 needs compute capability >= 8.0; {torch.cuda.get_device_name(device)} has less"
    return None


def _measure(refusal: str | None, make: Callable[[], Callable[[], Any]], timer: Timer, point: CalibrationPoint):
    if refusal:
        return {"error": refusal}
    try:
        fn = make()
        return {"times_s": timer.times(fn, warmup=point.warmup, iterations=point.iterations)}
    except (RuntimeError, NotImplementedError) as exc:  # a dtype the device's kernels refuse
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}


def _precision_switch(precision: str) -> None:
    """torch's TF32 switches as a training point of `precision` sets them (ddlbench.train.execution.
    configure_execution): fp32 strict, TF32 only for tf32. Process-wide; cuDNN's own default is TF32 on."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def _matmul(n: int, precision: str, device: torch.device) -> Callable[[], Any]:
    _precision_switch(precision)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=generator).to(device=device, dtype=DTYPES[precision])
    b = torch.randn(n, n, generator=generator).to(device=device, dtype=DTYPES[precision])
    c = torch.empty(n, n, device=device, dtype=DTYPES[precision])
    return lambda: torch.mm(a, b, out=c)


def _conv(shape: tuple[int, ...], precision: str, device: torch.device) -> Callable[[], Any]:
    _precision_switch(precision)
    batch, channels, side, kernel = shape
    generator = torch.Generator().manual_seed(0)
    dtype = DTYPES[precision]
    x = torch.randn(batch, channels, side, side, generator=generator).to(device=device, dtype=dtype)
    w = torch.randn(channels, channels, kernel, kernel, generator=generator).to(device=device, dtype=dtype)
    return lambda: F.conv2d(x, w, padding="same")


def run_collectives_torch(point: CalibrationPoint, device: torch.device) -> list[dict[str, Any]]:
    timer, rank, world = Timer(device), dist.get_rank(), dist.get_world_size()
    make = functools.partial(_torch_op, rank=rank, world=world, device=device)
    return (
        _over_sizes(point, world, make, timer, before=dist.barrier)
        + _busy(point, world, make, device)
        + _beside(point, world, make, device)
    )


# the compute a rank runs before each collective in busy mode, as a step computes between its collectives
BUSY_BURSTS_S = (0.0005, 0.004)
BUSY_REPEATS = 3  # busy mode times `iterations` × this many calls per size and burst: its figure is a mean


def _busy(point: CalibrationPoint, world: int, make: Callable[..., Callable[[], Any]], device: torch.device):
    """Every collective and size again, each call after a burst of this rank's own compute instead of a
    barrier: the ranks arrive as a step's ranks do, a little apart, and the call's time on each rank is
    what a step waits for it (its peers' lateness included). Per call, the burst's and the call's seconds."""
    if device.type != "cpu":
        return []
    a, b = torch.randn(96, 96), torch.randn(96, 96)
    began = time.perf_counter()
    for _ in range(50):
        torch.mm(a, b)
    # every rank runs the same number of products (rank 0's estimate): bursts of equal work, as a step's
    # ranks have, so a call waits only for a peer that was slowed, not for one given more to do
    per_mm = torch.tensor([(time.perf_counter() - began) / 50], dtype=torch.float64)
    dist.broadcast(per_mm, src=0)
    per_mm = float(per_mm)
    out = []
    for op in point.collectives:
        for size in point.message_bytes:
            elements = max(world, (size // 4) // world * world)
            call = make(op, elements)
            for burst in BUSY_BURSTS_S:
                repeats = max(1, round(burst / per_mm))
                bursts, times = [], []
                dist.barrier()
                for index in range(point.warmup + point.iterations * BUSY_REPEATS):
                    started = time.perf_counter()
                    for _ in range(repeats):
                        torch.mm(a, b)
                    issued = time.perf_counter()
                    call()
                    ended = time.perf_counter()
                    if index >= point.warmup:
                        bursts.append(issued - started)
                        times.append(ended - issued)
                out.append({"op": op, "bytes": elements * 4, "mode": "busy", "burst_s": bursts, "times_s": times})
    return out


BESIDE_OPS = ("all_reduce", "reduce_scatter", "all_gather")  # what data-parallel steps overlap with backward
BESIDE_MIN_BYTES = 16 * 2**20  # a bucket's size (DDP's and zero2's default cap: 25 MiB)
# the chain runs this many times the collective alone, so the collective ends inside it: beside the chain a
# collective took about twice its time alone (gloo on 2 cores, 2026-12-07), and 1.5 (until then) fell short
BESIDE_CHAIN = 3.0
BESIDE_SIDE = 256  # the chain's products: 256 × 256 matrices, 33.5 MFLOP each


def _beside(point: CalibrationPoint, world: int, make: Callable[..., Callable[[], Any]], device: torch.device):
    """The share of a rank's cores a collective takes from the compute it runs beside (CPU only). Each rank is
    pinned to its threads' cores and gloo's own threads run there too, so a collective in flight during
    backward slows it: by nothing if gloo only waited, by the whole collective if it computed all along. Per
    size, iterations of: the chain alone, the collective alone (both after a barrier), and the collective
    started asynchronously with the chain run at once while a thread of the rank waits on it; each rank keeps
    its own four times (the fourth: the collective's own length beside the chain, from its start until that
    thread's wait returns, _waited).
    The chain's length is rank 0's estimate of BESIDE_CHAIN × the collective alone, the same on every rank."""
    ops = [op for op in point.collectives if op in BESIDE_OPS]
    if device.type != "cpu" or not ops or not point.message_bytes:
        return []
    sizes = [size for size in point.message_bytes if size >= BESIDE_MIN_BYTES] or [max(point.message_bytes)]
    a, b = torch.randn(BESIDE_SIDE, BESIDE_SIDE), torch.randn(BESIDE_SIDE, BESIDE_SIDE)
    out_mm = torch.empty(BESIDE_SIDE, BESIDE_SIDE)

    def chain(products: int) -> float:
        began = time.perf_counter()
        for _ in range(products):
            torch.mm(a, b, out=out_mm)
        return time.perf_counter() - began

    out = []
    for op in ops:
        for size in sizes:
            elements = max(world, (size // 4) // world * world)
            call, started = make(op, elements), make(op, elements, async_op=True)
            call()  # its buffers taken once before the estimate; the warm-up iterations below warm the rest
            dist.barrier()
            per_product = chain(20) / 20
            began = time.perf_counter()
            call()
            estimate = torch.tensor([BESIDE_CHAIN * (time.perf_counter() - began) / per_product], dtype=torch.float64)
            dist.broadcast(estimate, src=0)
            products = max(1, round(float(estimate)))
            alone, calls, beside, in_flight = [], [], [], []
            for index in range(point.warmup + point.iterations):
                dist.barrier()
                chain_s = chain(products)
                dist.barrier()
                began = time.perf_counter()
                call()
                call_s = time.perf_counter() - began
                dist.barrier()
                began = time.perf_counter()
                ended = _waited(started())
                beside_s = chain(products)
                done_s = ended() - began
                if index >= point.warmup:
                    alone.append(chain_s)
                    calls.append(call_s)
                    beside.append(beside_s)
                    in_flight.append(done_s)
            out.append(
                {
                    "op": op,
                    "bytes": elements * 4,
                    "mode": "beside",
                    "products": products,
                    "compute_s": alone,
                    "times_s": calls,
                    "beside_s": beside,
                    "call_beside_s": in_flight,
                }
            )
    return out


def _waited(work: Any) -> Callable[[], float]:
    """Waits on `work` (a collective's Work) in a thread of its own, started now; the function returned joins it
    and gives the perf_counter at which its wait returned (raising what the wait raised). A poll of
    `is_completed()` between the chain's products would do only where a Work reports its end: gloo's reduce-
    scatter (torch 2.13) reports none until its wait has returned, though its data moved long before (a wait
    0.5 s after its start returned in 1 ms), so polled, it read as ending when the chain ended and the wait after
    it returned, and its stretch (≥ BESIDE_CHAIN) and in-flight share were those of the chain, not its own.
    The wait releases the GIL, and so do the chain's products: the thread wakes within a product of the end."""
    outcome: list[Any] = []

    def wait() -> None:
        try:
            work.wait()
            outcome.append(time.perf_counter())
        except BaseException as error:  # handed to the caller's thread
            outcome.append(error)

    waiter = threading.Thread(target=wait, name="ddlbench-beside-wait", daemon=True)
    waiter.start()

    def ended() -> float:
        waiter.join()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    return ended


def _over_sizes(
    point: CalibrationPoint, world: int, make: Callable[..., Callable[[], Any]], timer: Timer, *, before: Callable
) -> list[dict[str, Any]]:
    """Every collective of the point at every message size: `make(op, elements)` builds one call."""
    out = []
    for op in point.collectives:
        for size in point.message_bytes:
            elements = max(world, (size // 4) // world * world)
            times = timer.times(make(op, elements), warmup=point.warmup, iterations=point.iterations, before=before)
            out.append({"op": op, "bytes": elements * 4, "times_s": times})
    return out


def _torch_op(
    op: str, elements: int, *, rank: int, world: int, device: torch.device, async_op: bool = False
) -> Callable[[], Any]:
    """One call of `op` on `elements` float32 values; with async_op, a call that returns its Work unwaited
    (not for send_recv)."""
    whole = torch.ones(elements, device=device)
    part = torch.ones(elements // world, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(whole, async_op=async_op)
    if op == "all_gather":  # all_gather_single: torch ≥ 2.11's name of all_gather_into_tensor
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(whole, part, async_op=async_op)
    if op == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(part, whole, async_op=async_op)
    if async_op:
        raise ValueError(f"collective {op!r} is timed blocking only")
    if op == "broadcast":
        return lambda: dist.broadcast(whole, src=0)
    if op == "send_recv":
        last = world - 1

        def ping_pong() -> None:
            if rank == 0:
                dist.send(whole, dst=last)
                dist.recv(whole, src=last)
            elif rank == last:
                dist.recv(whole, src=0)
                dist.send(whole, dst=0)

        return ping_pong
    raise ValueError(f"collective {op!r} unknown")


def run_collectives_mpi(point: CalibrationPoint) -> tuple[list[dict[str, Any]], str]:
    """The same collectives through mpi4py on numpy buffers (host memory); returns them and MPI's name."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    if world != point.world_size:
        raise RuntimeError(
            f"MPI.COMM_WORLD has {world} ranks, the point {point.world_size}: MPI points must start under mpirun "
            "or srun with an MPI plugin, not ddlbench's local launcher"
        )
    last = world - 1

    def make(op: str, elements: int) -> Callable[[], Any]:
        whole = np.ones(elements, dtype=np.float32)
        part = np.ones(elements // world, dtype=np.float32)
        result = np.empty_like(whole)

        def ping_pong() -> None:
            if rank == 0:
                comm.Send(whole, dest=last)
                comm.Recv(whole, source=last)
            elif rank == last:
                comm.Recv(whole, source=0)
                comm.Send(whole, dest=0)

        calls = {
            "all_reduce": lambda: comm.Allreduce(whole, result),
            "all_gather": lambda: comm.Allgather(part, whole),
            "reduce_scatter": lambda: comm.Reduce_scatter_block(whole, part),
            "broadcast": lambda: comm.Bcast(whole, root=0),
            "send_recv": ping_pong,
        }
        return calls[op]

    out = _over_sizes(point, world, make, Timer(torch.device("cpu")), before=comm.Barrier)
    version = MPI.Get_library_version().replace("\x00", "").strip().split(",")[0]  # "Open MPI v4.1.4"
    return out, f"mpi ({version})"
