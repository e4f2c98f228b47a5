"""Independent work of one finishing step (the rows of a study's 10,000 records, the models of its
thousands of series) spread over the CPUs this process may use, in forked worker processes.

Forked, so that nothing is imported again and the function's inputs need not be pickled one by one;
the results come back in order, each exactly what one process computes (the same code on the same
numbers). Below `least` items per worker, or where fork is not available, it all runs here: a worker
costs about 10 ms to start and its results must be pickled back.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

_WORK: tuple[Callable, Sequence] | None = None  # what the forked workers run: inherited, not pickled


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: inside a SLURM job, what the job was given)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def map_forked(
    function: Callable[[Item], Result], items: Sequence[Item], *, least: int, workers: int | None = None
) -> list[Result]:
    """[function(item) for item in items], over `workers` forked processes (default: usable_cpus(), no
    more than one per `least` items)."""
    global _WORK
    if workers is None:
        workers = min(usable_cpus(), len(items) // max(least, 1))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods() or _WORK is not None:
        return [function(item) for item in items]
    chunks = [range(start, len(items), workers * 4) for start in range(workers * 4)]  # interleaved: even loads
    _WORK = (function, items)
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            parts = list(pool.map(_run_chunk, chunks))
    finally:
        _WORK = None
    out: list = [None] * len(items)
    for chunk, results in zip(chunks, parts, strict=True):
        for index, result in zip(chunk, results, strict=True):
            out[index] = result
    return out


def _run_chunk(indices: range) -> list:
    assert _WORK is not None, "map_forked's work is inherited by forked workers only"
    function, items = _WORK
    return [function(items[i]) for i in indices]
