"""Tensor memory of one rank, with one definition on the CPU and on CUDA.

**Definition.** `tensor_peak_bytes` is the highest number of bytes of tensor storages that the rank's
device allocator held at any moment from the model's construction to the end of the probed step,
minus the input pool (the batches made resident before timing, a benchmark artefact reported apart
as `input_pool_bytes`). `tensor_resident_bytes` is the same count at the probed step's start:
parameters, gradients, optimizer state, communication buckets, whatever a strategy keeps. The probed
step is the last warm-up step, and only when there are two or more: never a timed step, never the
first step (which builds buffers, buckets and caches).

**CPU.** torch.profiler with `profile_memory=True` reports every allocation and free of the CPU
allocator (c10's DefaultCPUAllocator) with its size, C++-held storages included (DDP's buckets,
FSDP's gather buffers). The running sum of those sizes, from a profiler started before the model is
built, is the allocator's live total. Its limit: the profiler sees the thread that started it, and
torch runs a CPU step's forward, backward and optimizer on that thread; allocations made on other
threads (gloo's worker threads) are not counted. Blocks allocated before the profiler started are
not counted either, nor their frees. A free made on another thread is unseen: gloo's reduce-scatter
and all-gather clone their input inside the collective's call on the rank's thread
(`aten::clone < c10d::_reduce_scatter_base_` in the event tree), and the clone dies with the work,
which gloo's worker thread often drops last (in about one call of ten on this project's 2-core
machine). Such a block, made inside a `c10d::` call and never seen freed, belongs to a collective
that the strategy waited for within its step: it is taken as freed before the probed step if it was
made earlier, and as live to the probed step's end if made during it (an upper bound; the bytes so
bounded are named in the method). Other blocks whose free is unseen stay counted until their address
is handed out again: a strategy's own buffers handed to an asynchronous collective are therefore
dropped through `wait_and_release` (ddlbench.train.strategies.common), which waits for gloo's thread
to let go of them so that the rank's thread frees them.

**CUDA.** The caching allocator's own counters: `max_memory_allocated`, reset once the inputs are
resident, read when the probed step has been enqueued (its allocations happen on the host, so no
synchronisation is needed); `memory_allocated` at the step's start.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch._C._profiler import _EventType

log = logging.getLogger(__name__)

PROBE_MARK = "ddlbench::memory_probe"


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


class MemoryProbe:
    """Measures a rank's tensor memory: `start()` before the model is built, `inputs_resident()` once
    the input pool exists, `probing()` around the probed step, `finish()` right after it."""

    def __init__(self, device: torch.device, *, enabled: bool, why_not: str = "") -> None:
        self.device = device
        self.enabled = enabled
        self.why_not = why_not
        self._profiler: torch.profiler.profile | None = None
        self._cuda_resident: int | None = None
        self._probed = False

    def start(self) -> None:
        if not self.enabled or self.device.type != "cpu":
            return
        self._profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True, record_shapes=False
        )
        self._profiler.__enter__()

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
        with torch.profiler.record_function(PROBE_MARK):
            yield

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
        if profiler is None or not self._probed:
            return MemoryFigures(
                peak_bytes=None, resident_bytes=None, input_pool_bytes=input_pool_bytes, method="not probed"
            )
        live = allocator_peak(profiler)
        bounded = (
            f"; {live.bounded_collective_bytes} bytes of collective buffers freed unseen, counted to the "
            "probed step's end"
            if live.bounded_collective_bytes
            else ""
        )
        return MemoryFigures(
            peak_bytes=live.peak_bytes - input_pool_bytes,
            resident_bytes=live.resident_bytes - input_pool_bytes,
            input_pool_bytes=input_pool_bytes,
            method="cpu allocator events (torch.profiler profile_memory, main thread) from model construction"
            + bounded,
        )


COLLECTIVE_PREFIX = "c10d::"  # the dispatcher's name of every torch.distributed collective call


@dataclass(frozen=True, kw_only=True)
class LiveBytes:
    resident_bytes: int  # live at the probed step's start
    peak_bytes: int  # highest live during it (at least resident_bytes)
    bounded_collective_bytes: int  # blocks made by a collective during it, freed unseen, counted to its end


def allocator_peak(profiler: torch.profiler.profile) -> LiveBytes:
    """The live bytes at the probed step's start and their peak during it, from the allocator's events.

    The live total follows the allocations and frees the profiler saw, in time order, block by block
    (by address). A free the profiler could not see (made on another thread) shows when the same
    address is handed out again: the old block is then dropped before the new one counts. A block made
    inside a collective's call and never seen freed gets a free: just before the probed step when it
    was made earlier, at the probed step's end when made during it (see the module's docstring). Frees
    of blocks allocated before the profiler started are ignored, like those blocks.
    """
    nodes = list(_walk(profiler.profiler.kineto_results.experimental_event_tree()))
    marks = [node for node in nodes if node.name == PROBE_MARK]
    if len(marks) != 1:
        raise RuntimeError(f"expected one {PROBE_MARK!r} range in the profile, found {len(marks)}")
    begin, end = marks[0].start_time_ns, marks[0].end_time_ns
    changes = sorted(
        (node.start_time_ns, node.extra_fields.ptr, node.extra_fields.alloc_size, _inside_collective(node))
        for node in nodes
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu"
    )
    changes, bounded = _free_collective_buffers(changes, begin, end)
    blocks: dict[int, int] = {}
    live = resident = 0
    peak = None
    for when, pointer, size, _ in changes:
        if when > end:
            break
        if size > 0:
            live += size - blocks.get(pointer, 0)
            blocks[pointer] = size
        else:
            live -= blocks.pop(pointer, 0)
        if when < begin:
            resident = live
        else:
            peak = live if peak is None else max(peak, live)
    return LiveBytes(
        resident_bytes=resident,
        peak_bytes=max(resident, peak if peak is not None else resident),
        bounded_collective_bytes=bounded,
    )


Change = tuple[int, int, int, bool]  # (time ns, address, bytes: > 0 allocated, < 0 freed, made by a collective)


def _free_collective_buffers(changes: list[Change], begin: int, end: int) -> tuple[list[Change], int]:
    """`changes` with a free added for every block made inside a collective's call whose free is unseen
    (its address is handed out again, or the profile ends, with no free seen), and the bytes of those
    made during [begin, end]. A block whose address is handed out again is dropped then anyway; a free
    is added only where that comes too late (after the probed step's start or end)."""
    unseen: list[tuple[Change, int | None]] = []  # (the block, when its address was handed out again)
    open_blocks: dict[int, Change] = {}  # the block made last at each address, until seen freed
    for change in changes:
        when, pointer, size = change[0], change[1], change[2]
        if size > 0:
            previous = open_blocks.get(pointer)
            if previous is not None and previous[3]:
                unseen.append((previous, when))
            open_blocks[pointer] = change
        else:
            open_blocks.pop(pointer, None)
    unseen += [(change, None) for change in open_blocks.values() if change[3]]
    added: list[Change] = []
    bounded = 0
    for (when, pointer, size, _), reused in unseen:
        if when < begin:
            if reused is None or reused >= begin:
                added.append((begin - 1, pointer, -size, True))
        elif when <= end:
            bounded += size
            if reused is None or reused > end:
                added.append((end, pointer, -size, True))
    return sorted(changes + added), bounded


def _inside_collective(node) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.name.startswith(COLLECTIVE_PREFIX):
            return True
        parent = parent.parent
    return False


def _walk(nodes):
    for node in nodes:
        yield node
        yield from _walk(node.children)
