"""The figures inside a step, from stamps whose times the test sets (a fake clock), and the wrapper of
torch.distributed's functions on a real one-rank gloo group."""

from __future__ import annotations

import copy
import math
import time

import pytest
import torch
import torch.distributed as dist

from ddlbench.analysis.inside.figures import anatomy_figures
from ddlbench.records import RankResult
from ddlbench.train.recording import comms, recorder
from ddlbench.train.recording.recorder import IterationRecorder, intersect, union


class FakeClock:
    """Stamps are whatever time the test last set."""

    def __init__(self) -> None:
        self.now = 0.0

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def stamp(self) -> float:
        return self.now

    host_stamp = stamp

    @staticmethod
    def resolve(stamp: float) -> float:
        return stamp


@pytest.fixture
def timed():
    clock = FakeClock()
    rec = IterationRecorder(clock=clock)
    recorder.install(rec)
    rec.open_window()
    yield rec, clock
    recorder.install(None)


def at(clock: FakeClock, t: float) -> None:
    clock.now = t


def ddp_like_step(rec: IterationRecorder, clock: FakeClock, index: int = 0, origin: float = 0.0) -> None:
    """forward [0, 3]; backward [3, 8] with bucket 1 issued at 4 (done 6) and the last bucket at 7 (done 7.5);
    update [8, 9]; the step ends at 10."""

    def t(x: float) -> None:
        at(clock, origin + x)

    t(0)
    rec.begin_step(index)
    with recorder.phase("forward"):
        t(3)
    with recorder.phase("backward"):
        t(4)
        first = rec.comm_issued("ddp_bucket", 400, 2, tail=True)
        t(6)
        rec.comm_completed(first)
        t(7)
        last = rec.comm_issued("ddp_bucket", 100, 2, tail=True)
        t(7.5)
        rec.comm_completed(last)
        t(8)
    with recorder.phase("update"):
        t(9)
    t(10)
    rec.end_step()


def test_ddp_buckets_split_into_hidden_and_exposed(timed):
    rec, clock = timed
    ddp_like_step(rec, clock)
    rec.close_window()
    f = {name: values[0] for name, values in rec.figures().figures.items()}
    assert f["step_s"] == 10
    assert f["comm_s"] == 2.5  # [4, 6] ∪ [7, 7.5]
    assert f["comm_exposed_s"] == 0.5  # the tail: last bucket issued (gradients done) until all complete
    assert f["comm_hidden_s"] == 2.0
    assert f["backward_s"] == 4.5 and f["exposed_backward_s"] == 0.5
    assert f["forward_s"] == 3 and f["update_s"] == 1 and f["data_s"] == 0
    assert f["other_s"] == 1.0  # [9, 10]
    assert f["busy_s"] == 9.5
    assert f["comm_ops"] == 2 and f["comm_bytes"] == 500
    total = f["data_s"] + f["forward_s"] + f["backward_s"] + f["update_s"] + f["other_s"] + f["comm_exposed_s"]
    assert total == f["step_s"]


def test_a_late_stamped_bucket_completion_stays_inside_backward(timed):
    """DDP's backward returns only after its buckets complete; a completion stamped after that (its callback
    waited for the GIL) must not count the update as waiting."""
    rec, clock = timed
    at(clock, 0)
    rec.begin_step(0)
    with recorder.phase("backward"):
        at(clock, 7)
        last = rec.comm_issued("ddp_bucket", 100, 2, tail=True)
        at(clock, 8)
    with recorder.phase("update"):
        at(clock, 8.5)
        last.completed = 8.5  # the callback's stamp, late
        at(clock, 9)
    rec.end_step()
    rec.close_window()
    f = {name: values[0] for name, values in rec.figures().figures.items()}
    assert f["exposed_backward_s"] == 1.0 and f["exposed_update_s"] == 0.0 and f["update_s"] == 1.0
    assert f["comm_s"] == 1.0 and f["comm_hidden_s"] == 0.0


def test_synchronous_and_waited_collectives(timed):
    rec, clock = timed
    at(clock, 0)
    rec.begin_step(5)
    with recorder.phase("forward"):
        at(clock, 1)
        sync = rec.comm_issued("all_reduce", 8)
        at(clock, 2)
        sync.waits.append((1.0, 2.0))  # what the wrapper does for a synchronous call
        sync.completed = 2.0
        pending = rec.comm_issued("reduce_scatter_tensor", 16)  # async, no future: bounded by its wait
        at(clock, 4)
    with recorder.phase("backward"):
        at(clock, 5)
        with rec.blocked(pending):
            at(clock, 6)
        with recorder.phase("forward"):  # nested: still backward
            at(clock, 7)
    at(clock, 8)
    rec.end_step()
    rec.close_window()
    result = rec.figures()
    f = {name: values[0] for name, values in result.figures.items()}
    assert f["comm_s"] == 5  # [1, 2] ∪ [2, 6]
    assert f["comm_exposed_s"] == 2  # [1, 2] and the wait [5, 6]
    assert f["exposed_forward_s"] == 1 and f["exposed_backward_s"] == 1
    assert f["forward_s"] == 3 and f["backward_s"] == 2
    assert result.completions == {"observed": 1, "waited": 1, "none": 0}
    events = rec.events(5)
    assert {(e["cat"], e["name"]) for e in events} >= {
        ("phase", "forward"),
        ("phase", "backward"),
        ("wait", "wait reduce_scatter_tensor"),
    }
    assert [e["name"] for e in events if e["cat"] == "phase"] == ["forward", "backward"]


PARTS = ("data_s", "forward_s", "backward_s", "update_s", "other_s", "comm_exposed_s")


def test_the_parts_of_real_steps_hold_what_a_clock_outside_the_recorder_saw():
    """On the host clock, with sleeps whose lengths are known: each phase holds at least its sleeps, the
    sleep outside every phase lands in other_s (time the phases do not claim is not lost), and the step
    lies within the test's own stamps taken around it. time.sleep waits at least its argument on the
    monotonic clock, so every bound holds however busy the machine is."""
    planned = {"data": 0.002, "forward": 0.004, "backward": 0.006, "update": 0.002}
    unrecorded, recomputed = 0.005, 0.001
    rec = IterationRecorder()
    recorder.install(rec)
    outside: list[float] = []
    try:
        rec.open_window()
        for index in range(3):
            began = time.monotonic()
            rec.begin_step(index)
            for kind, seconds in planned.items():
                with recorder.phase(kind):
                    time.sleep(seconds)
                    if kind == "backward":
                        with recorder.phase("forward"):  # a recomputed forward is backward's
                            time.sleep(recomputed)
                if kind == "forward":
                    time.sleep(unrecorded)  # inside the step, outside every phase
            rec.end_step()
            outside.append(time.monotonic() - began)
        rec.close_window()
    finally:
        recorder.install(None)
    f = rec.figures().figures
    for i, wall in enumerate(outside):
        assert math.fsum(f[name][i] for name in PARTS) == pytest.approx(f["step_s"][i], rel=1e-12)
        assert sum(planned.values()) + recomputed + unrecorded <= f["step_s"][i] <= wall + 1e-6
        for kind, seconds in planned.items():
            assert f[f"{kind}_s"][i] >= seconds + (recomputed if kind == "backward" else 0.0)
        assert f["other_s"][i] >= unrecorded
        assert f["comm_exposed_s"][i] == 0.0


def test_nothing_is_stamped_outside_the_window():
    clock = FakeClock()
    rec = IterationRecorder(clock=clock)
    recorder.install(rec)
    try:
        with recorder.phase("forward"):
            assert rec.comm_issued("all_reduce", 4) is None
        rec.begin_step(0)  # before open_window: ignored
        assert rec._step is None
    finally:
        recorder.install(None)
    assert rec.figures().figures["step_s"] == ()


def test_interval_arithmetic():
    assert union([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert intersect([(0, 2), (3, 4)], [(1, 3.5)]) == [(1, 2), (3, 3.5)]


def rank_result(rank: int, busy: list[float], step: list[float], **fields) -> RankResult:
    exposed = [s - b for s, b in zip(step, busy, strict=True)]
    anatomy = {name: tuple(0.0 for _ in step) for name in recorder.FIGURES}
    anatomy |= {"step_s": tuple(step), "busy_s": tuple(busy), "comm_exposed_s": tuple(exposed)}
    anatomy |= {"comm_s": tuple(exposed), "comm_hidden_s": tuple(0.0 for _ in step)}
    return RankResult(
        rank=rank,
        hostname=f"host{rank}",
        step_times_s=tuple(step),
        losses=(1.0,),
        peak_rss_bytes=0,
        anatomy=anatomy,
        **fields,
    )


def test_straggler_is_the_busiest_rank_and_the_others_wait_for_it():
    steps = [1.0, 1.0, 1.0, 1.0]
    ranks = [
        rank_result(0, [0.6, 0.6, 0.6, 0.6], steps),
        rank_result(1, [0.9, 0.9, 0.5, 0.9], steps),  # slowest in 3 of 4 steps
        rank_result(2, [0.3, 0.6, 0.6, 0.6], steps),
    ]
    figures = anatomy_figures(ranks, dropped=0, job_step_times=steps)
    straggler = figures["straggler"]
    assert (straggler.rank, straggler.hostname, straggler.slowest_steps, straggler.steps) == (1, "host1", 3, 4)
    # step 0: the others lack 0.3 and 0.6 on rank 1 → mean 0.45; steps 1 and 3: 0.3 each; step 2: rank 0
    # (lowest of the busiest) is slowest, others lack 0.1 and 0 → 0.05
    assert straggler.wait_s.median == pytest.approx(0.3)
    assert straggler.skew_s.max == pytest.approx(0.6)
    assert figures["comm_overlap"].median == 0.0  # communication but none hidden


def test_update_gaps_are_between_one_update_and_the_next():
    steps = [1.0, 1.0, 1.0]
    ranks = [
        rank_result(r, [0.5] * 3, steps, update_starts_s=(0.8, 1.8, 2.9), update_ends_s=(0.9, 1.9, 3.0)) for r in (0, 1)
    ]
    gaps = anatomy_figures(ranks, dropped=0, job_step_times=steps)["update_gap_s"]
    assert gaps.n == 2 and gaps.min == pytest.approx(0.9) and gaps.max == pytest.approx(1.0)
    # steps dropped as warm-up are left out, and the first kept step has no previous update to measure from
    assert anatomy_figures(ranks, dropped=1, job_step_times=steps)["update_gap_s"].n == 1


def test_figures_of_a_cuda_record_come_from_its_stamped_steps_only():
    """On CUDA only the traced steps are stamped (RankResult.anatomy_steps): the point's figures are taken
    over the kept steps every rank stamped, each value matched to its own step."""
    from ddlbench.analysis.inside.figures import rank_medians

    job = [1.0, 1.0, 1.0, 1.0, 1.0]
    stamped = (3, 4)  # the last two of five measured steps
    ranks = [
        rank_result(
            0, [0.6, 0.7], [1.0, 1.0], anatomy_steps=stamped, update_starts_s=(3.8, 4.9), update_ends_s=(3.9, 5.0)
        ),
        rank_result(
            1, [0.9, 0.2], [1.0, 1.0], anatomy_steps=stamped, update_starts_s=(3.8, 4.7), update_ends_s=(3.9, 4.8)
        ),
    ]
    figures = anatomy_figures(ranks, dropped=1, job_step_times=job)
    straggler = figures["straggler"]
    assert straggler.steps == 2 and straggler.slowest_steps == 1 and straggler.rank == 0  # a tie: the lower rank
    assert figures["phases_s"]["comm_exposed_s"].n == 2
    # step 3's mean exposed wait: (0.4 + 0.1) / 2; step 4's: (0.3 + 0.8) / 2
    assert sorted(
        [figures["phases_s"]["comm_exposed_s"].min, figures["phases_s"]["comm_exposed_s"].max]
    ) == pytest.approx([0.25, 0.55])
    gaps = figures["update_gap_s"]  # step 4's update start minus step 3's update end, per rank: 1.0 and 0.8
    assert gaps.n == 1 and gaps.median == pytest.approx(0.9)
    # a dropped step that was stamped is left out; a rank without the step leaves it out for all
    assert anatomy_figures(ranks, dropped=4, job_step_times=job)["straggler"].steps == 1
    other = rank_result(1, [0.5], [1.0], anatomy_steps=(4,))
    assert anatomy_figures([ranks[0], other], dropped=0, job_step_times=job)["straggler"].steps == 1
    assert anatomy_figures(ranks, dropped=5, job_step_times=job)["phases_s"] is None
    assert rank_medians(ranks[1], dropped=4)["busy_s"] == pytest.approx(0.2)


def test_records_without_anatomy_have_no_inside_figures():
    plain = RankResult(rank=0, hostname="h", step_times_s=(1.0,), losses=(1.0,), peak_rss_bytes=0)
    assert anatomy_figures([plain], dropped=0, job_step_times=[1.0])["phases_s"] is None


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    comms.install()
    try:
        yield
    finally:
        comms.uninstall()
        dist.destroy_process_group()


def test_wrapped_collectives_are_stamped_and_still_work(one_rank_group):
    rec = IterationRecorder()
    recorder.install(rec)
    try:
        rec.open_window()
        rec.begin_step(0)
        x = torch.ones(256)
        dist.all_reduce(x)  # synchronous
        work = dist.all_reduce(x, async_op=True)
        work.wait()
        assert work.is_completed()  # the wrapped Work still answers what a Work does
        dist.P2POp(dist.isend, x, 0)  # P2POp still recognises the (wrapped) isend
        rec.end_step()
        rec.close_window()
    finally:
        recorder.install(None)
    assert torch.equal(x, torch.ones(256))
    sync, waited = rec.steps[0].comms
    assert (sync.op, sync.nbytes, sync.completed is not None, len(sync.waits)) == ("all_reduce", 1024, True, 1)
    assert waited.completed is not None and len(waited.waits) == 1  # completion from the future, plus the wait
    figures = rec.figures().figures
    assert figures["comm_ops"] == (2,)
    assert math.isclose(figures["comm_s"][0], figures["comm_exposed_s"][0] + figures["comm_hidden_s"][0])


def test_uninstall_restores_torch_distributed(one_rank_group):
    wrapped = dist.all_reduce
    comms.uninstall()
    assert dist.all_reduce is not wrapped and dist.all_reduce is dist.distributed_c10d.all_reduce
    comms.install()


def test_ddps_stamping_hook_divides_a_bucket_only_where_the_group_has_peers(one_rank_group, monkeypatch):
    """The hook averages each bucket before its all-reduce; on a group of one that is a division by 1, a pass
    over every gradient that torch's own DDP does not make, so it is left out there, and the gradients are the
    plain model's."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils._python_dispatch import TorchDispatchMode

    class Divisions(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.sizes: list[int] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket is torch.ops.aten.div_:
                self.sizes.append(args[0].numel())
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    wrapped = DistributedDataParallel(copy.deepcopy(plain), init_sync=False)
    comms.trace_ddp(wrapped)
    x = torch.randn(8, 64)
    plain(x).square().sum().backward()
    with Divisions() as counted:
        wrapped(x).square().sum().backward()
    assert counted.sizes == []
    for mine, theirs in zip(wrapped.module.parameters(), plain.parameters(), strict=True):
        assert torch.equal(mine.grad, theirs.grad)
    # on a group of two it divides every bucket once, before issuing its all-reduce (the equivalence tests
    # check the average over real ranks; here, that the pass is there: the group's size and the all-reduce
    # stood in for, as rank 0 of a group whose peer never joins could not all-reduce)
    bucket, issued = torch.ones(10), []

    class Bucket:
        def buffer(self):
            return bucket

    def all_reduce(tensor, group=None, async_op=False):
        issued.append(tensor.clone())
        future = torch.futures.Future()
        future.set_result([tensor])
        return type("Work", (), {"get_future": lambda self: future})()

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(comms, "original", lambda name: all_reduce)
    with Divisions() as counted:
        comms._ddp_bucket_hook(None, Bucket()).wait()
    assert counted.sizes == [10] and torch.equal(issued[0], torch.full((10,), 0.5))
