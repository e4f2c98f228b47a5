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
  (read and write) ÷ the time of one copy, median and CI as above.

These are not the standard suite's figures (smaller sizes, one short budget): their own family, `quick/`, so
that no band of one is applied to the other. Without NVML there is no health reading, and the line says
"not measurable here: no NVML" (ddlbench.train.nvml).
"""

from __future__ import annotations

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
CUDA_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
TF32_MIN_CAPABILITY = (8, 0)


def quick_figures(*, budget_s: float = BUDGET_S) -> tuple[list[Figure], str]:
    """Every figure of this node, and the device(s) they were measured on (a machine file's `device.name`)."""
    import torch

    if torch.cuda.is_available():
        devices = [torch.device("cuda", index) for index in range(torch.cuda.device_count())]
        names = sorted({torch.cuda.get_device_name(device) for device in devices})
    else:
        devices, names = [torch.device("cpu")], []
    figures = []
    for device in devices:
        suffix = f"/{device}" if device.type == "cuda" else ""
        for precision in precisions(device):
            flop_per_s = _matmul(device, precision, budget_s)
            figures.append(_figure(f"quick/matmul_flop_per_s/{precision}{suffix}", "FLOP/s", flop_per_s,
                                   f"2n³ ÷ one product's time, n = {MATMUL_N[device.type]}"))  # fmt: skip
        copy = _copy(device, budget_s)
        figures.append(_figure(f"quick/memory_bandwidth_bytes_per_s{suffix}", "B/s", copy,
                               f"2 × {COPY_BYTES[device.type]} B ÷ one copy's time"))  # fmt: skip
    return figures, ", ".join(names) or "cpu"


def precisions(device: Any) -> tuple[str, ...]:
    import torch

    if device.type != "cuda":
        return ("fp32",)
    capable = torch.cuda.get_device_capability(device) >= TF32_MIN_CAPABILITY
    return tuple(p for p in CUDA_PRECISIONS if p != "tf32" or capable)


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


def _matmul(device: Any, precision: str, budget_s: float) -> list[float]:
    import torch

    n = MATMUL_N[device.type]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        seconds = _timed(lambda: torch.mm(a, b), device, budget_s)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
    return [2 * n**3 / s for s in seconds]


def _copy(device: Any, budget_s: float) -> list[float]:
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


def health_note() -> str:
    """What the quick check says of the GPUs' health: NVML's readings are issue 32's next step; here only
    whether NVML is there at all, and why not."""
    from ddlbench.train.nvml import nvml

    lib, why = nvml()
    return (
        "health: NVML present, not read by the quick check yet"
        if lib is not None
        else f"health: not measurable here: {why}"
    )


def quick_line(certificate: dict[str, Any], elapsed_s: float, health: str) -> str:
    """The one line a health checker logs: the verdict, then what did not pass (or the counts)."""
    bad = [entry for entry in certificate["figures"] if entry["passed"] is False]
    head = f"ddlbench certify quick {certificate['system']}:{certificate['partition']}"
    where = socket.gethostname()
    if certificate["passed"]:
        return f"{head} {where}: PASS ({certificate['counts']['pass']} figures in {elapsed_s:.1f} s; {health})"
    if not bad:
        return f"{head} {where}: FAIL (no quick/ reference for this system:partition; {health})"
    reasons = "; ".join(
        f"{entry['status']}: {entry['name']} "
        + (
            f"{entry['value']:.4g} {entry['unit']} outside [{_bound(entry['lower'])}, {_bound(entry['upper'])}]"
            if entry["value"] is not None
            else entry["why_missing"]
        )
        for entry in bad
    )
    return f"{head} {where}: FAIL ({reasons}; {health})"


def _bound(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"
