"""Real data read while training (ddlbench.train.data.loader): every step reads its own samples through
a DataLoader, the wait on input is a figure, workers run on the rank's loader cores, and synthetic data
stays resident."""

from __future__ import annotations

import functools
import os
import statistics
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from ddlbench.analysis.aggregate import build_table
from ddlbench.catalog import DATASETS
from ddlbench.launch.runner import run_point
from ddlbench.metrics import summarize_ranks
from ddlbench.records import PointRecord, RankResult, Stats
from ddlbench.report.render import render_report
from ddlbench.train.data import open_dataset
from ddlbench.train.data.loader import InputLoader, StepSlices, reads_through_loader, split_cores
from tests.conftest import make_point
from tests.float64 import check_against_reference_float64
from tests.report_data import tables
from tests.test_aggregate import record_for, write
from tests.test_data import write_cifar
from tests.test_records import sample_record
from tests.test_report import sweep as report_sweep

# bounds on measured waits: alone on the machine (make test runs these after the parallel part)
pytestmark = pytest.mark.serial

# samples of the tiny CIFAR-10 fixture: more than any test reads, so no sample repeats within a run
SAMPLES = 200
# seconds a slow source sleeps per batch; every bound on a wait below follows from it
DELAY = 0.2


@pytest.fixture
def cifar(tmp_path):
    """A CIFAR-10 binary batch of SAMPLES random images, every one distinct."""
    rng = np.random.default_rng(1)
    folder = tmp_path / "cifar"
    folder.mkdir()
    pixels = rng.integers(0, 256, (SAMPLES, 3, 32, 32), dtype=np.uint8)
    write_cifar(folder / "data_batch_1.bin", rng.integers(0, 10, SAMPLES, dtype=np.uint8), pixels)
    return folder


def opener(path, seed: int = 0):
    return functools.partial(open_dataset, DATASETS.get("cifar10"), seed=seed, path=str(path))


class SlowSource:
    """The CIFAR fixture, with every batch taking DELAY seconds more to read (picklable for workers)."""

    def __init__(self, path) -> None:
        self.source = opener(path)()

    def batch(self, start: int, size: int):
        time.sleep(DELAY)
        return self.source.batch(start, size)


class AffinityReport:
    """A source whose 'inputs' name the process that read them and 'targets' its CPU affinity."""

    def batch(self, start: int, size: int):
        cpus = sorted(os.sched_getaffinity(0))
        return torch.tensor([os.getpid()]), torch.tensor(cpus)


def loader_over(open_source, *, workers: int, steps: int, start: int = 0, stop: int = 4, global_batch: int = 8):
    cores = split_cores(os.sched_getaffinity(0), threads=1, workers=workers, shared=True)  # nothing pinned
    return InputLoader(
        open_source,
        global_batch=global_batch,
        start=start,
        stop=stop,
        steps=steps,
        workers=workers,
        device=torch.device("cpu"),
        cores=cores,
    )


def read_all(loader: InputLoader, steps: int, *, compute_s: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    batches = []
    try:
        for _ in range(steps):
            batches.append(loader.next_batch())
            time.sleep(compute_s)  # the step's work, while workers read ahead
    finally:
        loader.close()
    return batches


# --- addressing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_each_step_reads_this_ranks_slice_of_its_own_global_batch(cifar, workers):
    """Step s of rank slice [start, stop) is BatchSource.batch(s·G + start, stop − start): distinct samples
    every step, and the ranks' slices put together are what one process reads."""
    source, steps, global_batch = opener(cifar)(), 5, 12
    slices = [(0, 5), (5, 12)]  # uneven, as a pipeline's or a hybrid's may be
    got = {
        piece: read_all(
            loader_over(opener(cifar), workers=workers, steps=steps, start=piece[0], stop=piece[1], global_batch=12),
            steps,
        )
        for piece in slices
    }
    seen = set()
    for step in range(steps):
        whole_inputs, whole_targets = source.batch(step * global_batch, global_batch)
        for start, stop in slices:
            inputs, targets = got[(start, stop)][step]
            want_inputs, want_targets = source.batch(step * global_batch + start, stop - start)
            assert torch.equal(inputs, want_inputs) and torch.equal(targets, want_targets)
        joined = [torch.cat([got[piece][step][part] for piece in slices]) for part in (0, 1)]
        assert torch.equal(joined[0], whole_inputs) and torch.equal(joined[1], whole_targets)
        seen |= {image.numpy().tobytes() for image in whole_inputs}
    assert len(seen) == steps * global_batch  # no sample read twice over the run


def test_step_slices_refuse_a_slice_outside_the_batch_and_a_step_past_the_run(cifar):
    with pytest.raises(ValueError, match=r"slice \[4, 9\) is not within a global batch of 8"):
        StepSlices(opener(cifar), global_batch=8, start=4, stop=9, steps=2)
    with pytest.raises(IndexError, match="step 2 of a run of 2"):
        StepSlices(opener(cifar), global_batch=8, start=0, stop=8, steps=2)[2]


def test_a_synthetic_point_reads_no_loader_and_refuses_loader_workers(cifar):
    assert not reads_through_loader(make_point())
    assert reads_through_loader(make_point(data_path=str(cifar), loader_workers=2))
    with pytest.raises(ValueError, match=r"loader_workers=2: cifar10 is synthetic here .* must be 0 without `data:`"):
        reads_through_loader(make_point(loader_workers=2))


# --- the wait on input -------------------------------------------------------------------------------


def test_the_wait_grows_by_the_time_reading_takes_when_the_rank_reads_itself(cifar):
    """0 workers: the rank reads each batch inside next(), so each wait is at least the DELAY injected,
    while the plain source's reads of 4 images in memory stay far below it."""
    steps = 4
    fast = loader_over(opener(cifar), workers=0, steps=steps)
    read_all(fast, steps)
    slow = loader_over(functools.partial(SlowSource, cifar), workers=0, steps=steps)
    read_all(slow, steps)
    assert len(slow.waits_s) == len(fast.waits_s) == steps
    assert min(slow.waits_s) >= DELAY
    assert statistics.median(fast.waits_s) + DELAY / 2 < statistics.median(slow.waits_s)


@pytest.mark.slow
def test_a_worker_reads_ahead_while_the_step_computes(cifar):
    """1 worker, steps that compute for 3·DELAY: after the first, each batch was read during the previous
    step, so the median wait is below DELAY/2, where reading in the rank waits DELAY or more."""
    steps = 4
    ahead = loader_over(functools.partial(SlowSource, cifar), workers=1, steps=steps)
    read_all(ahead, steps, compute_s=3 * DELAY)
    inline = loader_over(functools.partial(SlowSource, cifar), workers=0, steps=steps)
    read_all(inline, steps, compute_s=3 * DELAY)
    assert min(inline.waits_s) >= DELAY
    assert statistics.median(ahead.waits_s[1:]) < DELAY / 2


def test_point_figures_take_the_slowest_rank_per_kept_step_and_its_share_of_the_step():
    point = make_point(nodes=2, steps=4)
    starts = (0.0, 1.0, 2.0, 3.0)

    def rank(r: int, waits: tuple[float, ...], source: str = "loader") -> RankResult:
        return RankResult(
            rank=r,
            hostname="h",
            step_times_s=(0.5,) * 4,
            step_starts_s=starts,
            step_ends_s=tuple(s + 0.5 for s in starts),
            losses=(1.0,) * 5,
            peak_rss_bytes=1,
            input_source=source,
            input_wait_s=waits,
        )

    metrics = summarize_ranks(point, [rank(0, (0.1, 0.2, 0.05, 0.1)), rank(1, (0.2, 0.1, 0.05, 0.3))])
    assert metrics.input_wait_s.n == 4 and metrics.input_wait_s.median == pytest.approx(0.2)
    assert metrics.input_wait_s.max == pytest.approx(0.3)
    assert metrics.input_wait_share.median == pytest.approx(0.4)  # 0.2 s of each 0.5 s step
    resident = summarize_ranks(point, [rank(0, (), "resident"), rank(1, (), "resident")])
    assert resident.input_wait_s is None and resident.input_wait_share is None
    with pytest.raises(ValueError, match="did not time its wait on input at every measured step"):
        summarize_ranks(point, [rank(0, (0.1,)), rank(1, (0.1,) * 4)])


# --- cores -------------------------------------------------------------------------------------------


def test_cores_split_into_the_ranks_threads_then_one_per_worker_or_not_at_all():
    cores = split_cores({7, 3, 5, 9}, threads=2, workers=2, shared=False)
    assert (cores.rank_cpus, cores.worker_cpus) == ((3, 5), (7, 9))
    assert cores.binding == "threads on 3,5, workers on 7,9"
    shared = split_cores({0, 1, 2}, threads=1, workers=2, shared=True)
    assert (shared.rank_cpus, shared.worker_cpus) == ((0, 1, 2), ()) and "shared with other ranks" in shared.binding
    few = split_cores({0, 1}, threads=2, workers=1, shared=False)
    assert few.worker_cpus == () and "has 2 CPUs, fewer than 2 threads + 1 workers" in few.binding
    assert split_cores({0, 1}, threads=1, workers=0, shared=False).worker_cpus == ()


@pytest.mark.slow
def test_workers_run_on_their_own_cores_and_the_ranks_threads_on_the_rest():
    """Read back in the worker itself: its affinity is its one loader core; the rank's threads keep the
    first `threads` CPUs while the loader runs, and get their whole affinity back when it closes."""
    affinity = sorted(os.sched_getaffinity(0))
    if len(affinity) < 2:
        pytest.skip("needs 2 CPUs in the affinity")
    cores = split_cores(affinity[:2], threads=1, workers=1, shared=False)
    loader = InputLoader(
        AffinityReport,
        global_batch=1,
        start=0,
        stop=1,
        steps=2,
        workers=1,
        device=torch.device("cpu"),
        cores=cores,
    )
    try:
        during = os.sched_getaffinity(0)
        pid, worker_cpus = loader.next_batch()
    finally:
        loader.close()
    assert int(pid) != os.getpid()  # read in the worker
    assert worker_cpus.tolist() == [affinity[1]]
    assert during == {affinity[0]}
    assert sorted(os.sched_getaffinity(0)) == affinity


# --- whole points ------------------------------------------------------------------------------------


# Training resnet8 on these random images for 10 steps is chaotic in float32: a ReLU input sits within a
# rounding of its gate, so the reference cut into the ranks' halves (the same arithmetic under GroupNorm)
# ends 1.9 (AVX-512) and 2.3 (scalar ATen) bounds from itself, and the reference with each weight
# gradient perturbed by one rounding (tests/chaos.py) 1.9 bounds. So the real run checks its record, its
# waits and its first loss, and the same ranks and loaders compare their parameters in float64.
@pytest.mark.slow
@pytest.mark.equivalence
def test_two_ranks_reading_real_data_match_one_process_and_record_their_wait(tmp_path, cifar):
    """2 ranks with a worker each, 10 steps (more than the synthetic pool of 8): every step a new global
    batch, and the run ends where one process training on the same batches does."""
    fields = dict(nodes=2, batch_size=8, warmup_steps=2, steps=8, model_options=(("norm", "group"),))
    check = check_against_reference_float64(tmp_path, real_run=True, **fields, data_path=str(cifar), loader_workers=1)
    record, metrics = check.record, check.record.metrics
    for rank in record.ranks:
        assert rank.input_source == "loader" and rank.loader_workers == 1
        assert len(rank.input_wait_s) == 8 and all(wait >= 0 for wait in rank.input_wait_s)
        # unpinned ranks of one host share their CPUs: nothing is split, and the record says so
        assert rank.loader_cpus == () and "shared with other ranks" in rank.loader_binding
    assert metrics.input_pool_bytes == 0
    assert metrics.input_wait_s.n == 8 - metrics.warmup_dropped_steps
    assert 0 <= metrics.input_wait_share.median < 1 and "loader workers" in metrics.cores_note
    again = PointRecord.from_dict(record.to_dict())
    assert again.metrics.input_wait_s == metrics.input_wait_s
    assert again.ranks[0].input_wait_s == record.ranks[0].input_wait_s


@pytest.mark.slow
def test_a_pinned_rank_splits_its_cores_and_synthetic_data_stays_resident(tmp_path, cifar, monkeypatch):
    """One rank of 1 thread + 1 worker on 2 cores of its own (claimed, not oversubscribed): the worker
    gets the second. The same point on synthetic data cycles its resident pool and records no loader."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs in the affinity")
    monkeypatch.setenv("DDLBENCH_CPU_LOCK_DIR", str(tmp_path / "locks"))  # no claim by other runs stands in the way
    real = make_point(data_path=str(cifar), loader_workers=1, steps=2, oversubscribe=False)
    record = run_point(real, out=tmp_path / "real" / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    (rank,) = record.ranks
    claimed = sorted(rank.cpus)
    assert len(claimed) == 2 and rank.loader_cpus == (claimed[1],)
    assert rank.loader_binding == f"threads on {claimed[0]}, workers on {claimed[1]}"

    synthetic = make_point(steps=2)
    record = run_point(synthetic, out=tmp_path / "synthetic" / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    (rank,) = record.ranks
    assert rank.input_source == "resident" and rank.input_wait_s == () and rank.loader_binding == ""
    assert record.metrics.input_wait_s is None and record.metrics.input_pool_bytes > 0


# --- records and report ------------------------------------------------------------------------------


def test_records_written_before_the_loader_read_as_resident_input():
    old = {"rank": 0, "hostname": "h", "step_times_s": [0.1], "losses": [1.0], "peak_rss_bytes": 1}
    rank = RankResult.from_dict(old)
    assert rank.input_source == "resident" and rank.input_wait_s == () and rank.loader_workers == 0
    record = sample_record()
    data = record.to_dict()
    for name in ("input_wait_s", "input_wait_share"):
        del data["metrics"][name]
    assert PointRecord.from_dict(data).metrics.input_wait_s is None


def test_the_report_shows_the_input_wait_only_where_a_point_read_through_a_loader(tmp_path):
    plan = report_sweep(tmp_path)
    reading, resident = plan.points[0], plan.points[1]
    loaded = record_for(reading)
    waits = (0.01, 0.02, 0.03, 0.02, 0.02, 0.01)
    metrics = replace(loaded.metrics, input_wait_s=Stats.of(waits), input_wait_share=Stats.of([w / 0.2 for w in waits]))
    ranks = tuple(replace(rank, input_source="loader", input_wait_s=waits) for rank in loaded.ranks)
    write(plan, [replace(loaded, metrics=metrics, ranks=ranks), record_for(resident)])
    table = build_table(plan)
    assert list(table["input_source"][:2]) == ["loader", "resident"]  # the third point has no record
    html = render_report(plan.config, table)
    points = tables(html)["points"]
    assert points["_titles"]["input_wait_s"] == "Input wait (s)" and "input_wait_share" in points
    wait = points["input_wait_s"]
    assert (wait["m"][0], wait["lo"][0], wait["hi"][0], wait["n"][0], wait["unit"]) == (0.02, 0.01, 0.03, 6, "steps")
    assert wait["m"][1] is None  # the resident point waited on nothing
    assert "longest host time any rank spent waiting for its batch" in html
    write(plan, [record_for(reading), record_for(resident)])
    html = render_report(plan.config, build_table(plan))
    assert "input_wait_s" not in tables(html)["points"] and "Input wait" not in html
