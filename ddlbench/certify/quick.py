"""`ddlbench certify --level quick`: a node's readiness in seconds, for a prolog, Slurm's HealthCheckProgram
(killed after 60 s) or LBNL's NHC: a short GEMM per precision and a memory copy on every device of this node
(each visible GPU, else the CPU), judged against the reference file's `quick/…` bands, with one line to say
why and an exit status; it drains nothing itself.

Figures (per device; the name ends in the device on a GPU node, `…/cuda:1`; a quick check is one node's, so
its figures are the partition's figures as this node reads them, and the line names the host):
- quick/matmul_flop_per_s/<precision>: C = A·B of n×n matrices, 2n³ FLOP ÷ the time of one product (CPU
  timer, or CUDA events), the median over the products of a budget of about BUDGET_S, with its 95 % CI
  (ddlbench.statistics.median_ci); n = MATMUL_N[device kind]. Precisions: fp32 on the CPU; fp32, tf32, bf16
  and fp16 on CUDA (tf32 where the card has it, compute capability ≥ 8.0);
- quick/memory_bandwidth_bytes_per_s: dst.copy_(src) of COPY_BYTES[device kind] bytes of float32, 2 × bytes
  (read and write) ÷ the time of one copy, median and CI as above;
- quick/host_to_device_bytes_per_s, quick/device_to_host_bytes_per_s (on a GPU): HOST_COPY_BYTES of pinned
  host memory copied to or from the GPU, bytes ÷ the time of one copy (one direction of the host link).

A load that raises is a failed figure with its cause (failures are data); the others still run.

These are not the standard suite's figures (smaller sizes, one short budget): their own family, `quick/`, so
that no band of one is applied to the other. Health: NVML's readings of each GPU over the loads
(ddlbench.certify.health), a check figure `health/cuda:<i>` per GPU that judges itself; without NVML one
`health/gpus` figure and the line say "not measurable here: no NVML: <why>".
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Callable
from typing import Any

from ddlbench.history.figures import Figure
from ddlbench.statistics import median_ci, percentile

BUDGET_S = 1.0  # per figure, after WARMUP untimed runs: a node's whole check stays far under 60 s
WARMUP = 3
MIN_SAMPLES = 6  # a figure rests on at least this many timed runs, however long each takes
MATMUL_N = {"cpu": 1024, "cuda": 8192}
COPY_BYTES = {"cpu": 64 * 2**20, "cuda": 1024 * 2**20}
CUDA_PRECISIONS = ("fp32", "tf32", "bf16", "fp16", "fp8")
TF32_MIN_CAPABILITY = (8, 0)
FP8_MIN_CAPABILITY = (8, 9)  # Ada and Hopper and later: float8 tensor cores (torch._scaled_mm)
HOST_COPY_BYTES = 256 * 2**20  # a pinned host buffer copied to or from the GPU, one direction at a time


def quick_figures(*, budget_s: float = BUDGET_S) -> tuple[list[Figure], str]:
    """Every figure of this node, health included, and the device(s) they were measured on (a machine file's
    `device.name`). A load that raises (an fp8 GEMM this torch cannot run) is a failed figure with its cause."""
    from ddlbench.certify.health import health_figures
    from ddlbench.train.energy import cuda_identity
    from ddlbench.train.health import HealthWatch

    devices, name = node_devices()
    watch = HealthWatch([(str(device), *cuda_identity(device)) for device in devices if device.type == "cuda"])
    figures = []
    for device in devices:
        for figure, unit, what, load in node_loads(device):
            try:
                values = load(budget_s)
            except RuntimeError as exc:  # failures are data: the figure says why it has no value
                figures.append(Figure.unmeasured(f"quick/{figure}", unit=unit, kind="machine", why=load_failure(exc)))
                continue
            finally:
                watch.sample()
            figures.append(_figure(f"quick/{figure}", unit, values, what))
    return figures + health_figures(watch.finish(), watch.why_not), name


def node_loads(device: Any) -> list[tuple[str, str, str, Callable[[float], list[float]]]]:
    """The loads of a node check on one device: (figure name without its family, unit, what one timed run is,
    the load given its budget in seconds). GEMM per precision and a memory copy; on a GPU also pinned copies
    to and from the host."""
    suffix = device_suffix(device)
    loads = [
        (f"matmul_flop_per_s/{precision}{suffix}", "FLOP/s",
         f"2n³ ÷ one product's time, n = {MATMUL_N[device.type]}",
         functools.partial(time_matmul, device, precision))
        for precision in precisions(device)
    ]  # fmt: skip
    copy = f"2 × {COPY_BYTES[device.type]} B ÷ one copy's time"
    loads.append((f"memory_bandwidth_bytes_per_s{suffix}", "B/s", copy, functools.partial(time_copy, device)))
    if device.type == "cuda":
        for direction in ("host_to_device", "device_to_host"):
            loads.append((f"{direction}_bytes_per_s{suffix}", "B/s",
                          f"{HOST_COPY_BYTES} B of pinned host memory ÷ one copy's time",
                          functools.partial(time_host_copy, device, direction)))  # fmt: skip
    return loads


def load_failure(exc: BaseException) -> str:
    """A failed load's cause, in one line: the exception's type and its first line."""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"


def node_devices() -> tuple[list[Any], str]:
    """The devices a node check loads (each visible GPU, else the CPU), and their name(s) ("cpu" for the CPU)."""
    import torch

    if torch.cuda.is_available():
        devices = [torch.device("cuda", index) for index in range(torch.cuda.device_count())]
        return devices, ", ".join(sorted({torch.cuda.get_device_name(device) for device in devices}))
    return [torch.device("cpu")], "cpu"


def device_suffix(device: Any) -> str:
    """The figure-name suffix of a device: `/cuda:1` on a GPU node, nothing for the CPU."""
    return f"/{device}" if device.type == "cuda" else ""


def precisions(device: Any) -> tuple[str, ...]:
    import torch

    if device.type != "cuda":
        return ("fp32",)
    capability = torch.cuda.get_device_capability(device)
    needs = {"tf32": TF32_MIN_CAPABILITY, "fp8": FP8_MIN_CAPABILITY}
    return tuple(p for p in CUDA_PRECISIONS if capability >= needs.get(p, (0, 0)))


def _figure(name: str, unit: str, values: list[float], what: str) -> Figure:
    ordered = sorted(values)
    interval = median_ci(ordered) or (None, None)
    return Figure(
        name=name,
        unit=unit,
        kind="machine",
        value=percentile(ordered, 50),
        ci_low=interval[0],
        ci_high=interval[1],
        n=len(values),
        basis=f"median over {len(values)} timed runs of {what} (95 % CI of the median)",
    )


def time_matmul(device: Any, precision: str, budget_s: float) -> list[float]:
    """FLOP/s of each timed n×n product in about `budget_s` (n = MATMUL_N[device kind])."""
    import torch

    n = MATMUL_N[device.type]
    if precision == "fp8":  # e4m3 inputs (b column-major, as cuBLASLt's fp8 GEMM takes it), bf16 output
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        seconds = _timed(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16), device, budget_s)
        return [2 * n**3 / s for s in seconds]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        seconds = _timed(lambda: torch.mm(a, b), device, budget_s)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    return [2 * n**3 / s for s in seconds]


def time_host_copy(device: Any, direction: str, budget_s: float) -> list[float]:
    """Bytes/s of each timed copy of HOST_COPY_BYTES between pinned host memory and the GPU, one direction:
    `host_to_device` or `device_to_host` (the bytes cross the host link once)."""
    import torch

    host = torch.empty(HOST_COPY_BYTES // 4, dtype=torch.float32, pin_memory=True)
    gpu = torch.empty(HOST_COPY_BYTES // 4, dtype=torch.float32, device=device)
    source, target = (host, gpu) if direction == "host_to_device" else (gpu, host)
    return [HOST_COPY_BYTES / s for s in _timed(lambda: target.copy_(source, non_blocking=True), device, budget_s)]


def time_copy(device: Any, budget_s: float) -> list[float]:
    """Bytes/s (read + write) of each timed copy of COPY_BYTES[device kind] in about `budget_s`."""
    import torch

    size = COPY_BYTES[device.type]
    src = torch.ones(size // 4, device=device)
    dst = torch.empty_like(src)
    return [2 * size / s for s in _timed(lambda: dst.copy_(src), device, budget_s)]


def _timed(work: Callable[[], Any], device: Any, budget_s: float) -> list[float]:
    """Seconds of each timed run of `work`, as many as fit in `budget_s` (at least MIN_SAMPLES)."""
    import torch

    on_cuda = device.type == "cuda"
    for _ in range(WARMUP):
        work()
    if on_cuda:
        torch.cuda.synchronize(device)
    seconds: list[float] = []
    began = time.perf_counter()
    while len(seconds) < MIN_SAMPLES or time.perf_counter() - began < budget_s:
        if on_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            work()
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1000.0)
        else:
            before = time.perf_counter()
            work()
            seconds.append(time.perf_counter() - before)
    return seconds


def quick_line(certificate: dict[str, Any], elapsed_s: float, *, level: str = "quick") -> str:
    """The one line a health checker logs: the verdict, then what did not pass (or the counts), and health."""
    bad = [entry for entry in certificate["figures"] if entry["passed"] is False]
    health = _health_words(certificate["figures"])
    head = f"ddlbench certify {level} {certificate['system']}:{certificate['partition']}"
    where = socket.gethostname()
    if certificate["passed"]:
        return f"{head} {where}: PASS ({certificate['counts']['pass']} figures in {elapsed_s:.1f} s; {health})"
    if not bad:
        return f"{head} {where}: FAIL (no {level}/ reference for this system:partition; {health})"
    reasons = "; ".join(f"{entry['status']}: {entry['name']} {_why(entry)}" for entry in bad)
    return f"{head} {where}: FAIL ({reasons}; {health})"


def _why(entry: dict[str, Any]) -> str:
    if entry["value"] is None:
        return entry["why_missing"]
    if entry.get("finding"):
        return entry["finding"]
    return f"{entry['value']:.4g} {entry['unit']} outside [{_bound(entry['lower'])}, {_bound(entry['upper'])}]"


def _health_words(entries: list[dict[str, Any]]) -> str:
    """health: what NVML said of the GPUs, in a few words (a failed GPU is among the line's reasons)."""
    health = [entry for entry in entries if entry["name"].startswith("health/")]
    unread = [entry["why_missing"] for entry in health if entry["value"] is None and not entry.get("check")]
    if unread:
        return f"health: {unread[0]}"
    if not health:
        return "health: no GPU"
    clean = sum(entry["status"] == "pass" for entry in health)
    return f"health: {clean} of {len(health)} GPU(s) clean"


def _bound(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"
