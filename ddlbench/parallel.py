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
    return start_forked(function, items, least=least, workers=workers)()


def start_forked(
    function: Callable[[Item], Result], items: Sequence[Item], *, least: int, workers: int | None = None
) -> Callable[[], list[Result]]:
    """map_forked begun: the workers are forked now and work while this process goes on; the function
    returned waits for them and returns the results in order. Without workers, the work is done when the
    results are asked for."""
    global _WORK
    if workers is None:
        workers = min(usable_cpus(), len(items) // max(least, 1))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods() or _WORK is not None:
        return lambda: [function(item) for item in items]
    chunks = [range(start, len(items), workers * 4) for start in range(workers * 4)]  # interleaved: even loads
    _WORK = (function, items)
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    try:
        futures = [pool.submit(_run_chunk, chunk) for chunk in chunks]  # a fork pool forks every worker here
    except BaseException:
        _WORK = None
        pool.shutdown(cancel_futures=True)
        raise

    def gather() -> list[Result]:
        global _WORK
        try:
            out: list = [None] * len(items)
            for chunk, future in zip(chunks, futures, strict=True):
                for index, result in zip(chunk, future.result(), strict=True):
                    out[index] = result
            return out
        finally:
            _WORK = None
            pool.shutdown(cancel_futures=True)

    return gather


def _run_chunk(indices: range) -> list:
    assert _WORK is not None, "map_forked's work is inherited by forked workers only"
    function, items = _WORK
    return [function(items[i]) for i in indices]
