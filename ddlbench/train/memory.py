"""Tensor memory of one rank, with one window on the CPU and on CUDA.

**Definition.** Let L(t) be the bytes of tensor storages that the rank's device allocator handed out
after the probe started (just before the model is built) and that are still live at instant t, over all
of the rank's threads. With the probed step running from t0 (its start) to t1 (its end):

    tensor_resident_bytes = L(t0) − input_pool_bytes                  (bytes)
    tensor_peak_bytes     = max over t0 ≤ t ≤ t1 of L(t) − input_pool_bytes   (bytes)

So the peak is the memory one training step in steady state needs: what is alive during it (parameters,
gradients, optimizer state, communication buffers, whatever a strategy keeps, and a real-data batch read
before it) plus what the step itself makes and frees (activations, their gradients, temporaries, a
collective's buffers). What earlier steps made and freed again (the first step's buckets and caches, a
compilation) is not in it; what they left alive is. The input pool (the synthetic batches made resident
before timing, a benchmark artefact) is reported apart as `input_pool_bytes`. The probed step is the last
warm-up step, and only when there are two or more: never a timed step, never the first step. The peak of
the whole run, first steps included, is the caching allocator's on CUDA (`cuda_run_peaks`, the record's
`cuda_peak_*_bytes`) and the process's resident set on the CPU (`peak_rss_bytes`).

**CPU.** c10's CPU allocator keeps a process-wide table of its live blocks and their total when its
flag `caffe2_report_cpu_memory_usage` is set; without it, only the thread running torch.profiler
updates the table. The probe sets the flag, an exported symbol of the libc10 this process has loaded
(found in /proc/self/maps, not by a search of torch's folder, which may hold another build), for its
duration. At its start it checks that the flag took effect: a block made on a helper thread must move the
allocator's total. It then runs torch.profiler with `profile_memory=True` on the rank's thread, where torch
runs a CPU step's forward, backward and optimizer. Every allocation and free that thread makes is an event
carrying the allocator's total over all threads at that instant (`total_allocated`), so blocks that
gloo's or Horovod's threads allocate or free (gloo's clones inside a reduce-scatter, a finished work's
buffers, Horovod's fusion buffer) count exactly, where they happened, as soon as the rank's thread next
allocates or frees. The probe allocates and frees one byte at its start and at the probed step's start
and end, so the total is read at those instants too: L(t) is a reading's total less the first reading's.
Before t0 it waits `SETTLE_S` for other threads to let go of finished work (gloo's worker thread holds a
finished work's buffers for microseconds after wait() returns), so that the resident figure is the state
between steps, not a backend's lag; after t1 it waits as long again before it stops the profiler, which a
thread still freeing a finished work's buffers could otherwise meet half torn down (a rank's SIGSEGV in a third
of the launches of one configuration). Blocks allocated before the probe started are not in the table,
nor are their frees. Between two events of the rank's thread, a block that another thread allocates and
frees again is not seen: the peak is low by such blocks. One probe per process (a rank's): the
allocator's table keeps the blocks a finished probe counted and that were freed after it, and a later
probe in the same process could take one of those for a block freed at the same address.

**CUDA.** The caching allocator's own counters, which count every thread's blocks: `memory_allocated` at
the probe's start (subtracted, as the CPU's first reading is), `reset_peak_memory_stats` then
`memory_allocated` at t0, `max_memory_allocated` at t1. Its allocations and frees are booked on the host
when enqueued, in stream order, so no synchronisation is needed. A pre-probe block freed during the run
lowers the CUDA figures where the CPU's ignore it; only gloo/NCCL set-up tensors are that old.

**A broken probe** (no such flag, a flag that does not take, a profile that does not add up: a
RuntimeError of the probe's own) yields no figures and `method` "not probed: <why>"; the point goes on.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch._C._profiler import _EventType

PROBE_MARK = "ddlbench::memory_probe"
READING_MARK = "ddlbench::memory_reading"  # the one-byte allocation whose events read the total
ACCOUNTING_FLAG = "FLAGS_caffe2_report_cpu_memory_usage"
LIBC10 = re.compile(r"libc10(-[0-9a-f]+)?\.(so(\.[0-9]+)*|dylib)")  # c10 itself, not libc10_cuda.so
CHECK_BYTES = 2**20  # the block the start-up check makes on a helper thread
# Before the resident reading, the time given to other threads to let go of the blocks of finished work:
# gloo's worker thread drops a finished work, and the clone it holds, microseconds after wait() returns
# (a 64 KiB clone still held at the first reading in 1 of 12 runs here, gone 1 ms later in all 12)
SETTLE_S = 0.02


class ProbeBroken(RuntimeError):
    """The probe cannot measure in this process; the message says why."""


@dataclass(frozen=True, kw_only=True)
class MemoryFigures:
    peak_bytes: int | None
    resident_bytes: int | None
    input_pool_bytes: int
    method: str  # how it was measured, or why it was not ("not probed: …")


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one storage count once)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def loaded_libc10(maps: Path = Path("/proc/self/maps")) -> list[Path]:
    """The libc10 files mapped into this process (normally one: the one `import torch` loaded)."""
    try:
        lines = maps.read_text().splitlines()
    except OSError as error:
        raise ProbeBroken(f"cannot list the libraries this process loaded ({maps}: {error.strerror})") from error
    paths = {line.split(maxsplit=5)[5] for line in lines if len(line.split(maxsplit=5)) == 6}
    return sorted(Path(path) for path in paths if LIBC10.fullmatch(Path(path).name))


@functools.cache
def process_wide_accounting() -> ctypes.c_bool:
    """c10's flag that makes its CPU allocator account for the blocks of every thread, in the libc10 this
    process runs; raises ProbeBroken where there is none. A forked child (a DataLoader worker) starts
    with it off: it is not probed, and the allocator's lock, which another thread may hold at the fork,
    stays untouched there."""
    libraries = loaded_libc10()
    if not libraries:
        raise ProbeBroken("no libc10 is mapped in this process (/proc/self/maps)")
    for library in libraries:
        try:
            flag = ctypes.c_bool.in_dll(ctypes.CDLL(str(library)), ACCOUNTING_FLAG)
        except (OSError, ValueError):
            continue
        os.register_at_fork(after_in_child=functools.partial(setattr, flag, "value", False))
        return flag
    raise ProbeBroken(
        f"the loaded {', '.join(map(str, libraries))} exports no {ACCOUNTING_FLAG} to count every thread's blocks"
    )


def check_accounting() -> None:
    """Raises ProbeBroken unless a block made on a helper thread moves the allocator's total, which is
    what the flag is for (without it, only the profiled thread's blocks count)."""
    held: list[torch.Tensor] = []
    helper = threading.Thread(
        target=lambda: held.append(torch.empty(CHECK_BYTES, dtype=torch.uint8)), name="ddlbench-memory-check"
    )
    with _profile() as profiler:
        _read_total()
        helper.start()
        helper.join()
        _read_total()
        held.clear()  # freed while the flag is on: no stale entry stays in the allocator's table
    totals = [total for _, total in _readings(_allocations(profiler))]
    if len(totals) != 2:
        raise ProbeBroken(f"the start-up check expected 2 allocator readings, found {len(totals)}")
    if totals[1] - totals[0] < CHECK_BYTES:
        raise ProbeBroken(
            f"{ACCOUNTING_FLAG} did not take effect: a {CHECK_BYTES}-byte block made on a helper thread moved "
            f"the allocator's total by {totals[1] - totals[0]} bytes"
        )


class MemoryProbe:
    """Measures a rank's tensor memory: `start()` before the model is built, `probing()` around the
    probed step, `finish()` right after it; `cuda_run_peaks()` at the end of the run."""

    def __init__(self, device: torch.device, *, enabled: bool, why_not: str = "") -> None:
        self.device = device
        self.enabled = enabled
        self.why_not = why_not
        self._error: str | None = None  # the first RuntimeError of the probe's own, once started
        self._profiler: torch.profiler.profile | None = None  # running
        self._finished_profiler: torch.profiler.profile | None = None  # stopped, to read
        self._flag: ctypes.c_bool | None = None
        self._flag_was = False
        self._cuda_baseline = 0
        self._cuda_resident: int | None = None
        self._cuda_peak: int | None = None
        self._cuda_before_reset = (0, 0)
        self._probed = False

    def start(self) -> None:
        if self.device.type == "cuda":
            # the run's peaks count from here: a point that follows another in the same process (a group
            # launch, ddlbench.launch.group) must not report the other's
            torch.cuda.reset_peak_memory_stats(self.device)
        if not self.enabled:
            return
        if self.device.type == "cuda":
            self._cuda_baseline = torch.cuda.memory_allocated(self.device)
            return
        try:
            self._flag = process_wide_accounting()
            self._flag_was, self._flag.value = self._flag.value, True  # before any block the probe counts
            check_accounting()
            self._profiler = _profile()
            self._profiler.__enter__()
            _read_total()  # the total before the model exists: what the figures are counted from
        except RuntimeError as error:  # ProbeBroken, or the profiler's own
            self._stop()
            self.enabled, self.why_not = False, f"not probed: {_describe(error)}"

    @contextlib.contextmanager
    def probing(self) -> Iterator[None]:
        self._probed = True
        if not self.enabled:
            yield
            return
        if self.device.type == "cuda":
            # the whole run's peaks so far, which the reset would lose (cuda_run_peaks)
            self._cuda_before_reset = self.cuda_run_peaks()
            torch.cuda.reset_peak_memory_stats(self.device)
            self._cuda_resident = torch.cuda.memory_allocated(self.device)
            yield
            self._cuda_peak = torch.cuda.max_memory_allocated(self.device)
            return
        time.sleep(SETTLE_S)  # a warm-up step: never timed
        mark = torch.profiler.record_function(PROBE_MARK)
        opened = self._guard(mark.__enter__)
        if opened:
            self._guard(_read_total)
        try:
            yield
        finally:
            if opened:
                self._guard(_read_total)
                self._guard(lambda: mark.__exit__(None, None, None))

    def finish(self, input_pool_bytes: int) -> MemoryFigures:
        if self._profiler is not None:
            # the collectives' threads let go of the step's last work before the profiler stops: stopped at once,
            # resnet20 on 3x160^2 with ddp on two ranks lost a rank to SIGSEGV in 8 of 24 launches (in the walk of
            # the profile's event tree), none of 24 after this wait (2026-12-07; docs/analytic.md, "The forty-fourth
            # scoring set")
            time.sleep(SETTLE_S)
        self._stop()  # whatever happened, neither the profiler nor the flag's mutex in the timed window
        if self.enabled and self._error is None and not self._probed:
            self._error = "the probed step never ran"
        if self.enabled and self._error is None and self.device.type == "cpu" and self._finished_profiler is None:
            self._error = "the probe was never started"
        if not self.enabled or self._error is not None:
            why = self.why_not if not self.enabled else f"not probed: {self._error}"
            return MemoryFigures(peak_bytes=None, resident_bytes=None, input_pool_bytes=input_pool_bytes, method=why)
        if self.device.type == "cuda":
            if self._cuda_peak is None or self._cuda_resident is None:
                return MemoryFigures(
                    peak_bytes=None,
                    resident_bytes=None,
                    input_pool_bytes=input_pool_bytes,
                    method="not probed: the probed step did not end",
                )
            return MemoryFigures(
                peak_bytes=self._cuda_peak - self._cuda_baseline - input_pool_bytes,
                resident_bytes=self._cuda_resident - self._cuda_baseline - input_pool_bytes,
                input_pool_bytes=input_pool_bytes,
                method="cuda caching allocator: max_memory_allocated over the probed step (peak reset at its start), "
                "counted from model construction, less the input pool",
            )
        try:
            live = allocator_peak(self._finished_profiler)
        except RuntimeError as error:
            return MemoryFigures(
                peak_bytes=None,
                resident_bytes=None,
                input_pool_bytes=input_pool_bytes,
                method=f"not probed: {_describe(error)}",
            )
        return MemoryFigures(
            peak_bytes=live.peak_bytes - input_pool_bytes,
            resident_bytes=live.resident_bytes - input_pool_bytes,
            input_pool_bytes=input_pool_bytes,
            method="cpu allocator events of the rank's thread, carrying the total of all its threads (torch.profiler "
            "profile_memory, c10 caffe2_report_cpu_memory_usage): peak over the probed step, counted from model "
            "construction, less the input pool",
        )

    def cuda_run_peaks(self) -> tuple[int, int]:
        """The caching allocator's peaks over the whole run so far (since start()), (allocated, reserved)
        bytes, inputs and first steps included: the reset at the probed step's start loses nothing of them."""
        allocated, reserved = self._cuda_before_reset
        return (
            max(allocated, torch.cuda.max_memory_allocated(self.device)),
            max(reserved, torch.cuda.max_memory_reserved(self.device)),
        )

    def _guard(self, action: Callable[[], object]) -> bool:
        """Runs one of the probe's own actions; a RuntimeError of it leaves the figures out, not the step."""
        try:
            action()
        except RuntimeError as error:
            self._error = self._error or _describe(error)
            return False
        return True

    def _stop(self) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            self._finished_profiler = profiler
            self._guard(lambda: profiler.__exit__(None, None, None))
        if self._flag is not None:
            self._flag.value = self._flag_was


def _describe(error: RuntimeError) -> str:
    return str(error) if isinstance(error, ProbeBroken) else f"the probe failed: {type(error).__name__}: {error}"


def _profile() -> torch.profiler.profile:
    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True, record_shapes=False
    )


def _read_total() -> None:
    """One allocation and its free, whose profiler events carry the allocator's total at this instant."""
    with torch.profiler.record_function(READING_MARK):
        torch.empty(1, dtype=torch.uint8)


@dataclass(frozen=True, kw_only=True)
class LiveBytes:
    resident_bytes: int  # L(t0): live at the probed step's start
    peak_bytes: int  # max of L(t) during it (at least resident_bytes)


def allocator_peak(profiler: torch.profiler.profile) -> LiveBytes:
    """L(t0) and the peak of L(t) over the probed step (the module's definition), from the allocator
    totals that the rank thread's events carry, less the probe's first reading.

    A reading's free event carries the total without the reading's own byte; its allocation event
    (one byte over) is left out of the peak.
    """
    marks = [
        node for node in _walk(profiler.profiler.kineto_results.experimental_event_tree()) if node.name == PROBE_MARK
    ]
    if len(marks) != 1:
        raise RuntimeError(f"expected one {PROBE_MARK!r} range in the profile, found {len(marks)}")
    begin, end = marks[0].start_time_ns, marks[0].end_time_ns
    events = _allocations(profiler)
    readings = _readings(events)
    inside = [(when, total) for when, total in readings if begin <= when <= end]
    if len(readings) < 3 or len(inside) != 2:
        raise RuntimeError(
            f"expected the probe's three allocator readings, found {len(readings)} ({len(inside)} in the step)"
        )
    baseline = readings[0][1]
    resident = inside[0][1] - baseline
    totals = [total for when, size, total, reading in events if begin <= when <= end and not (reading and size > 0)]
    return LiveBytes(resident_bytes=resident, peak_bytes=max(totals) - baseline)


def _allocations(profiler: torch.profiler.profile) -> list[tuple[int, int, int, bool]]:
    """The CPU allocator's events of the profiled thread, in time order: (ns, bytes ±, total, a reading?)."""
    return sorted(
        (node.start_time_ns, node.extra_fields.alloc_size, node.extra_fields.total_allocated, _is_reading(node))
        for node in _walk(profiler.profiler.kineto_results.experimental_event_tree())
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu"
    )


def _readings(events: list[tuple[int, int, int, bool]]) -> list[tuple[int, int]]:
    """(ns, total) at each reading's free: the allocator's total at that instant."""
    return [(when, total) for when, size, total, reading in events if reading and size < 0]


def _is_reading(node) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.name == READING_MARK:
            return True
        parent = parent.parent
    return False


def _walk(nodes):
    for node in nodes:
        yield node
        yield from _walk(node.children)
