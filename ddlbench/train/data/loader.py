"""Real data read while training: a DataLoader over this rank's slice of each step's global batch, timed.

**Addressing.** Step s of the run (warm-up included) reads global samples [s·G + start, s·G + stop) of
the dataset's seed-determined order, G being the global batch and [start, stop) this rank's slice
(the strategy's `local_batch_range`): the addressing of `BatchSource.batch`, so every sample of the
run is distinct (until the order wraps, a new epoch in the same order) and any split of ranks reads
exactly what one process would. One DataLoader item is one step's slice (`batch_size=None`: the
source batches itself), and one iterator spans every step, warm-up and measured alike: workers start
once, during warm-up, and keep prefetching across the barrier into the measured window.

**Workers** (`loader_workers`; 0 reads in the rank itself) are started with the *forkserver* method.
A rank has already started threads when its loader starts (gloo's, OpenMP's, CUDA's): `fork` would
copy the rank mid-flight, with locks held by threads that do not exist in the child (malloc, OpenMP,
gloo) and a CUDA context a child cannot use, and hangs that way are intermittent. The forkserver is a
fresh interpreter that imports this module (so torch) once, joins no process group and starts no
threads; each worker is forked from that clean state in milliseconds, where `spawn` would pay a full
interpreter and torch import per worker (~2.5 s each on a busy core). Workers open the dataset
themselves (`open_source`, a picklable recipe): a CIFAR or MNIST array, or a memory-mapped token file,
is never pickled through a pipe. Each worker prefetches PREFETCH_PER_WORKER steps ahead. Their
seeds come from a private generator, so starting a loader draws nothing from the rank's global RNG.

**Cores.** The rank's CPU affinity holds `threads + loader_workers` CPUs (ddlbench's pinning, or what
SLURM bound). When the rank has them to itself, its own threads (main, OpenMP, gloo) keep the first
`threads` and worker i the one after those, so compute and reading never share a core silently; a
rank that shares its CPUs with other ranks of its host (unpinned, oversubscribed) or holds too few
splits nothing and says so (`LoaderCores.binding`).

**Pinned memory.** On CUDA batches land in page-locked memory (the loader's pin-memory thread) and
are copied with `non_blocking=True`: the copy is enqueued on the current stream, ahead of the step's
kernels, and the host goes on.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, get_worker_info

from ddlbench.catalog import DATASETS
from ddlbench.point import Point
from ddlbench.train.data import BatchSource, open_dataset

log = logging.getLogger(__name__)

START_METHOD = "forkserver"  # see the module's docstring for why not fork (unsafe) or spawn (slow)
# steps each worker reads ahead: with W workers 2·W local batches in flight, enough to ride out one
# slow read (a large JPEG, a cold file) without holding many batches of host memory
PREFETCH_PER_WORKER = 2


@dataclass(frozen=True, kw_only=True)
class LoaderCores:
    """Where the rank's threads and its loader's workers run."""

    rank_cpus: tuple[int, ...]  # the rank's own threads (all of its affinity when nothing is split)
    worker_cpus: tuple[int, ...]  # worker i runs on worker_cpus[i]; () when nothing is split
    binding: str  # how the CPUs were split, or why they were not


def split_cores(affinity: Iterable[int], *, threads: int, workers: int, shared: bool) -> LoaderCores:
    """The rank's threads on the first `threads` CPUs of its affinity, each worker on one of the next.

    Nothing is split when there are no workers, when ranks of this host share CPUs (splitting would
    stack every rank's threads on the same first cores), or when the affinity holds fewer than
    threads + workers CPUs.
    """
    cpus = tuple(sorted(affinity))
    if workers < 0 or threads < 1:
        raise ValueError(f"threads={threads}, loader_workers={workers}: need threads ≥ 1 and loader_workers ≥ 0")
    if workers == 0:
        return LoaderCores(rank_cpus=cpus, worker_cpus=(), binding="no workers: read in the rank")
    if shared:
        why = f"not split: the rank's {len(cpus)} CPUs are shared with other ranks of its host"
        return LoaderCores(rank_cpus=cpus, worker_cpus=(), binding=why)
    if len(cpus) < threads + workers:
        why = f"not split: the rank has {len(cpus)} CPUs, fewer than {threads} threads + {workers} workers"
        return LoaderCores(rank_cpus=cpus, worker_cpus=(), binding=why)
    rank_cpus, worker_cpus = cpus[:threads], cpus[threads : threads + workers]
    binding = f"threads on {_listed(rank_cpus)}, workers on {_listed(worker_cpus)}"
    return LoaderCores(rank_cpus=rank_cpus, worker_cpus=worker_cpus, binding=binding)


def _listed(cpus: tuple[int, ...]) -> str:
    return ",".join(str(cpu) for cpu in cpus)


def pin_threads(cpus: Iterable[int]) -> dict[int, set[int]]:
    """Set the affinity of every thread of this process (threads started later inherit it from theirs);
    returns each thread's previous affinity, for `restore_threads` (the calling thread's under key -1)."""
    wanted = set(cpus)
    previous = {-1: os.sched_getaffinity(0)}
    for tid in _threads():
        try:
            previous[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, wanted)
        except (ProcessLookupError, PermissionError):  # the thread ended meanwhile
            continue
    return previous


def restore_threads(previous: dict[int, set[int]]) -> None:
    """Undo `pin_threads`; threads started since get what the pinning thread had."""
    if not previous:
        return
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, previous.get(tid, previous[-1]))
        except (ProcessLookupError, PermissionError):
            continue


def _threads() -> list[int]:
    return [int(name) for name in os.listdir("/proc/self/task")]


class StepSlices(Dataset):
    """Item s: this rank's samples [s·global_batch + start, s·global_batch + stop), as (inputs, targets).

    Holds `source` in the rank (0 workers); a worker gets the recipe alone and opens its own source.
    """

    def __init__(
        self,
        open_source: Callable[[], BatchSource],
        *,
        global_batch: int,
        start: int,
        stop: int,
        steps: int,
        source: BatchSource | None = None,
    ) -> None:
        if not 0 <= start <= stop <= global_batch:
            raise ValueError(f"slice [{start}, {stop}) is not within a global batch of {global_batch}")
        self.open_source = open_source
        self.global_batch, self.start, self.stop, self.steps = global_batch, start, stop, steps
        self.source = source

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> tuple[Tensor, Tensor]:
        if not 0 <= step < self.steps:
            raise IndexError(f"step {step} of a run of {self.steps}")
        if self.source is None:
            self.source = self.open_source()
        return self.source.batch(step * self.global_batch + self.start, self.stop - self.start)

    def __getstate__(self) -> dict:
        return self.__dict__ | {"source": None}  # workers open their own


class _StartWorker:
    """worker_init_fn: pin the worker (and its threads) to its CPU, then open the data before the first read."""

    def __init__(self, worker_cpus: tuple[int, ...], rank_cpus: tuple[int, ...]) -> None:
        self.worker_cpus, self.rank_cpus = worker_cpus, rank_cpus

    def __call__(self, worker_id: int) -> None:
        # always set: a forkserver started by an earlier loader of this process may carry another affinity
        pin_threads({self.worker_cpus[worker_id]} if self.worker_cpus else self.rank_cpus)
        slices = get_worker_info().dataset
        slices.source = slices.open_source()


class InputLoader:
    """This rank's batch of every step, read through a DataLoader; `next_batch` times each wait.

    waits_s[s] is the host time step s spent waiting for its input: blocked in the loader's next()
    plus enqueueing the copy to the device (seconds).
    """

    source_kind = "loader"

    def __init__(
        self,
        open_source: Callable[[], BatchSource],
        *,
        global_batch: int,
        start: int,
        stop: int,
        steps: int,
        workers: int,
        device: torch.device,
        cores: LoaderCores,
        source: BatchSource | None = None,
    ) -> None:
        self.device, self.cores, self.workers = device, cores, workers
        self.waits_s: list[float] = []
        slices = StepSlices(open_source, global_batch=global_batch, start=start, stop=stop, steps=steps, source=source)
        self._restore = pin_threads(cores.rank_cpus) if cores.worker_cpus else {}
        context = None
        if workers:
            context = multiprocessing.get_context(START_METHOD)
            context.set_forkserver_preload([__name__])  # only takes effect when the server starts
        self.loader = DataLoader(
            slices,
            batch_size=None,
            num_workers=workers,
            pin_memory=device.type == "cuda",
            worker_init_fn=_StartWorker(cores.worker_cpus, cores.rank_cpus) if workers else None,
            multiprocessing_context=context,
            generator=torch.Generator(),  # the workers' base seed, drawn apart from the rank's global RNG
            prefetch_factor=PREFETCH_PER_WORKER if workers else None,
            persistent_workers=workers > 0,
        )
        self._batches = iter(self.loader)  # starts the workers, which start reading at once

    def next_batch(self) -> tuple[Tensor, Tensor]:
        """The next step's (inputs, targets) on the device; its wait is appended to waits_s."""
        began = time.perf_counter()
        inputs, targets = next(self._batches)
        non_blocking = self.device.type == "cuda"  # pinned host memory: the copy is only enqueued
        batch = inputs.to(self.device, non_blocking=non_blocking), targets.to(self.device, non_blocking=non_blocking)
        self.waits_s.append(time.perf_counter() - began)
        return batch

    def close(self) -> None:
        """Stop the workers and give the rank's threads their whole affinity back."""
        batches, self._batches = self._batches, None
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()  # persistent workers stay up until told; the run has read its last step
        restore_threads(self._restore)
        self._restore = {}


# what the memory probe's figures mean for a point whose input comes from the loader
LOADER_MEMORY_NOTE = (
    "; no input pool: each step's batch comes from the loader and counts in that step's figures where this "
    "allocator holds it (its device copy on CUDA; on the CPU when read in the rank, not in a worker's shared memory)"
)


def reads_through_loader(point: Point) -> bool:
    """Whether the point reads real data through a loader (it has a data path); synthetic data stays resident."""
    if not point.data_path and point.loader_workers:
        raise ValueError(
            f"loader_workers={point.loader_workers}: {point.dataset} is synthetic here (no data path) and stays "
            "resident; loader_workers must be 0 without `data:`"
        )
    return bool(point.data_path)


def open_point_loader(
    point: Point,
    *,
    start: int,
    stop: int,
    device: torch.device,
    source: BatchSource | None = None,
    group: dist.ProcessGroup | None = None,
) -> InputLoader:
    """The point's loader over this rank's slice [start, stop) of every step's global batch.

    A collective when the point has workers (all ranks call it): ranks compare their affinities over
    `group` (a CPU group), so a rank splits its CPUs only when no other rank of its host shares them.
    `source`, the rank's already opened dataset, serves reads made in the rank (0 workers).
    """
    affinity = os.sched_getaffinity(0)
    shared = bool(point.loader_workers) and cpus_shared_on_host(affinity, group)
    cores = split_cores(affinity, threads=point.threads, workers=point.loader_workers, shared=shared)
    log.info("loader: %d workers, %s", point.loader_workers, cores.binding)
    return InputLoader(
        functools.partial(open_dataset, DATASETS.get(point.dataset), seed=point.seed, path=point.data_path),
        global_batch=point.global_batch_size,
        start=start,
        stop=stop,
        steps=point.warmup_steps + point.steps,
        workers=point.loader_workers,
        device=device,
        cores=cores,
        source=source,
    )


def cpus_shared_on_host(cpus: Iterable[int], group: dist.ProcessGroup | None = None) -> bool:
    """Whether another rank on this host may run on one of `cpus`; a collective over `group`."""
    mine = (socket.gethostname(), sorted(cpus))
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    me = dist.get_rank(group)
    return any(
        host == mine[0] and set(other) & set(mine[1]) for index, (host, other) in enumerate(everyone) if index != me
    )
