"""Tensor memory of one rank, with one definition on the CPU and on CUDA.

**Definition.** `tensor_peak_bytes` is the highest number of bytes of tensor storages that the rank's
device allocator held, over all of the rank's threads, at any moment from the model's construction to
the end of the probed step, minus the input pool (the batches made resident before timing, a
benchmark artefact reported apart as `input_pool_bytes`). `tensor_resident_bytes` is the same count at
the probed step's start: parameters, gradients, optimizer state, communication buffers, whatever a
strategy keeps. The probed step is the last warm-up step, and only when there are two or more: never a
timed step, never the first step (which builds buffers, buckets and caches).

**CPU.** c10's CPU allocator keeps a process-wide table of its live blocks and their total when its
flag `caffe2_report_cpu_memory_usage` is set; without it, only the thread running torch.profiler
updates the table. The probe sets the flag (an exported symbol of libc10) for its duration and runs
torch.profiler with `profile_memory=True` on the rank's thread, where torch runs a CPU step's forward,
backward and optimizer. Every allocation and free that thread makes is an event carrying the
allocator's total over all threads at that instant (`total_allocated`), so blocks that gloo's or
Horovod's threads allocate or free (gloo's clones inside a reduce-scatter, a finished work's buffers,
Horovod's fusion buffer) count exactly, where they happened, as soon as the rank's thread next
allocates or frees. The probe allocates and frees one byte at the probed step's start and end, so the
total is read at those instants too; before the start, it waits `SETTLE_S` for other threads to let go
of finished work (gloo's worker thread holds a finished work's buffers for microseconds after wait()
returns), so that the resident figure is the state between steps, not a backend's lag. Blocks allocated
before the probe started are not counted, nor their frees. Between two events of the rank's thread, a
block that another thread allocates and frees again is not seen: the peak is low by such blocks. Where
the flag cannot be set (no such symbol in this torch), nothing is reported. One probe per process (a
rank's): the allocator's table keeps the blocks a finished probe counted and that were freed after it,
and a later probe in the same process could take one of those for a block freed at the same address.

**CUDA.** The caching allocator's own counters: `max_memory_allocated`, reset once the inputs are
resident, read when the probed step has been enqueued (its allocations happen on the host, so no
synchronisation is needed); `memory_allocated` at the step's start.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch._C._profiler import _EventType

PROBE_MARK = "ddlbench::memory_probe"
READING_MARK = "ddlbench::memory_reading"  # the one-byte allocation whose events read the total
ACCOUNTING_FLAG = "FLAGS_caffe2_report_cpu_memory_usage"
# Before the resident reading, the time given to other threads to let go of the blocks of finished work:
# gloo's worker thread drops a finished work, and the clone it holds, microseconds after wait() returns
# (a 64 KiB clone still held at the first reading in 1 of 12 runs here, gone 1 ms later in all 12)
SETTLE_S = 0.02


@dataclass(frozen=True, kw_only=True)
class MemoryFigures:
    peak_bytes: int | None
    resident_bytes: int | None
    input_pool_bytes: int
    method: str  # how it was measured, or why it was not


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one storage count once)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@functools.cache
def process_wide_accounting() -> ctypes.c_bool | None:
    """c10's flag that makes its CPU allocator account for the blocks of every thread, or None where
    this torch's libc10 does not export it. A forked child (a DataLoader worker) starts with it off:
    it is not probed, and the allocator's lock, which another thread may hold at the fork, stays
    untouched there."""
    libraries = sorted((Path(torch.__file__).parent / "lib").glob("libc10.*"))
    for library in libraries:
        try:
            flag = ctypes.c_bool.in_dll(ctypes.CDLL(str(library)), ACCOUNTING_FLAG)
        except (OSError, ValueError):
            continue
        os.register_at_fork(after_in_child=functools.partial(setattr, flag, "value", False))
        return flag
    return None


class MemoryProbe:
    """Measures a rank's tensor memory: `start()` before the model is built, `inputs_resident()` once
    the input pool exists, `probing()` around the probed step, `finish()` right after it."""

    def __init__(self, device: torch.device, *, enabled: bool, why_not: str = "") -> None:
        self.device = device
        self.enabled = enabled
        self.why_not = why_not
        self._profiler: torch.profiler.profile | None = None
        self._flag: ctypes.c_bool | None = None
        self._flag_was = False
        self._cuda_resident: int | None = None
        self._probed = False

    def start(self) -> None:
        if not self.enabled or self.device.type != "cpu":
            return
        self._flag = process_wide_accounting()
        if self._flag is None:
            self.enabled = False
            self.why_not = f"not probed: this torch's libc10 has no {ACCOUNTING_FLAG} to count every thread's blocks"
            return
        self._flag_was, self._flag.value = self._flag.value, True  # before any block the probe counts
        self._profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True, record_shapes=False
        )
        self._profiler.__enter__()
        _read_total()  # the total before the model exists: what the figures are counted from

    def inputs_resident(self) -> None:
        if self.enabled and self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    @contextlib.contextmanager
    def probing(self) -> Iterator[None]:
        self._probed = True
        if self.device.type == "cuda":
            self._cuda_resident = torch.cuda.memory_allocated(self.device)
            yield
            return
        time.sleep(SETTLE_S)  # a warm-up step: never timed
        with torch.profiler.record_function(PROBE_MARK):
            _read_total()
            yield
            _read_total()

    def finish(self, input_pool_bytes: int) -> MemoryFigures:
        if not self.enabled:
            return MemoryFigures(
                peak_bytes=None, resident_bytes=None, input_pool_bytes=input_pool_bytes, method=self.why_not
            )
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
            return MemoryFigures(
                peak_bytes=peak - input_pool_bytes,
                resident_bytes=(self._cuda_resident or 0) - input_pool_bytes,
                input_pool_bytes=input_pool_bytes,
                method="cuda caching allocator: max_memory_allocated since the inputs were resident, minus them",
            )
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            profiler.__exit__(None, None, None)  # whatever happened, never into the timed window
        if self._flag is not None:
            self._flag.value = self._flag_was  # its mutex stays out of the timed steps
        if profiler is None or not self._probed:
            return MemoryFigures(
                peak_bytes=None, resident_bytes=None, input_pool_bytes=input_pool_bytes, method="not probed"
            )
        live = allocator_peak(profiler)
        return MemoryFigures(
            peak_bytes=live.peak_bytes - input_pool_bytes,
            resident_bytes=live.resident_bytes - input_pool_bytes,
            input_pool_bytes=input_pool_bytes,
            method="cpu allocator events of the rank's thread, carrying the total of all its threads (torch.profiler "
            "profile_memory, c10 caffe2_report_cpu_memory_usage), from model construction",
        )


def _read_total() -> None:
    """One allocation and its free, whose profiler events carry the allocator's total at this instant."""
    with torch.profiler.record_function(READING_MARK):
        torch.empty(1, dtype=torch.uint8)


@dataclass(frozen=True, kw_only=True)
class LiveBytes:
    resident_bytes: int  # live at the probed step's start
    peak_bytes: int  # highest live during it (at least resident_bytes)


def allocator_peak(profiler: torch.profiler.profile) -> LiveBytes:
    """The live bytes at the probed step's start and their peak during it, counted from the first
    reading (the probe's start), from the allocator totals that the rank thread's events carry.

    A reading's free event carries the total without the reading's own byte; its allocation event
    (one byte over) is left out of the peak.
    """
    nodes = list(_walk(profiler.profiler.kineto_results.experimental_event_tree()))
    marks = [node for node in nodes if node.name == PROBE_MARK]
    if len(marks) != 1:
        raise RuntimeError(f"expected one {PROBE_MARK!r} range in the profile, found {len(marks)}")
    begin, end = marks[0].start_time_ns, marks[0].end_time_ns
    events = sorted(
        (node.start_time_ns, node.extra_fields.alloc_size, node.extra_fields.total_allocated, _is_reading(node))
        for node in nodes
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu"
    )
    readings = [(when, total) for when, size, total, reading in events if reading and size < 0]
    inside = [(when, total) for when, total in readings if begin <= when <= end]
    if len(readings) < 3 or len(inside) != 2:
        raise RuntimeError(
            f"expected the probe's three allocator readings, found {len(readings)} ({len(inside)} in the step)"
        )
    baseline = readings[0][1]
    resident = inside[0][1] - baseline
    totals = [total for when, size, total, reading in events if begin <= when <= end and not (reading and size > 0)]
    return LiveBytes(resident_bytes=resident, peak_bytes=max(totals) - baseline)


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
