"""The packing of points into allocations (ddlbench.launch.packing): the plan is a valid schedule, is
greedy, respects the allocations' time limits, and its figures are what its placements add up to."""

from __future__ import annotations

import json
import random

import pytest
from conftest import REPO, run_cli

from ddlbench.errors import DdlbenchError
from ddlbench.launch.packing import Task, pack, pack_into, priority, simulate


def task(key: str, nodes: int, limit: float, expected: float | None = None, node: str = "") -> Task:
    return Task(key=key, nodes=nodes, limit_s=limit, expected_s=limit if expected is None else expected, node=node)


def test_widest_first_then_the_narrow_ones_side_by_side():
    tasks = [task("a", 1, 10), task("b", 2, 10), task("c", 1, 10), task("d", 1, 10)]
    (allocation,) = pack(tasks, 2).allocations
    starts = {p.key: (p.start_s, len(p.slots)) for p in allocation.expected.placements}
    assert starts == {"b": (0, 2), "a": (10, 1), "c": (10, 1), "d": (20, 1)}
    assert allocation.expected.makespan_s == 30
    # 50 node-seconds of work in 2 nodes × 30 s
    assert allocation.idle_share == pytest.approx(1 - 50 / 60)
    assert allocation.lower_bound_s == 25


def test_a_narrow_point_fills_nodes_a_wider_one_cannot_use_yet():
    # 3 nodes: a (2 nodes) runs; b (2 nodes) must wait for it, c (1 node) backfills the third node
    tasks = [task("a", 2, 20), task("b", 2, 10), task("c", 1, 5)]
    (allocation,) = pack(tasks, 3).allocations
    starts = {p.key: p.start_s for p in allocation.expected.placements}
    assert starts == {"a": 0, "c": 0, "b": 20}


def test_a_time_limit_splits_the_sweep_into_allocations_that_each_fit_it():
    tasks = [task(f"p{i}", 1, 10) for i in range(5)]
    packing = pack(tasks, 2, max_time_s=20)
    assert [len(a.order) for a in packing.allocations] == [4, 1]
    assert all(a.worst.makespan_s <= 20 for a in packing.allocations)


def test_the_worst_case_sets_the_limit_and_the_expected_times_the_makespan():
    tasks = [task("a", 1, 100, expected=10), task("b", 1, 100, expected=30)]
    (allocation,) = pack(tasks, 1).allocations
    assert allocation.worst.makespan_s == 200
    assert allocation.expected.makespan_s == 40


def test_pinned_points_wait_for_their_node_and_run_in_allocations_of_their_nodes():
    tasks = [task(f"{n}-{r}", 1, 10, node=n) for n in ("n1", "n2", "n3") for r in range(2)]
    tasks.append(task("free", 2, 10))
    packing = pack(tasks, 2)
    pinned = [a for a in packing.allocations if a.named]
    assert [a.named for a in pinned] == [("n1", "n2"), ("n3",)]
    for allocation in pinned:
        for placement in allocation.expected.placements:
            assert placement.slots == (placement.key.split("-")[0],)
        # one point per node at a time, every node busy from the start
        assert allocation.expected.makespan_s == 20
    (unpinned,) = [a for a in packing.allocations if not a.named]
    assert unpinned.nodes == 2 and [t.key for t in unpinned.order] == ["free"]


def test_what_cannot_be_packed_is_refused_naming_the_point_and_the_way_out():
    with pytest.raises(DdlbenchError, match=r"point wide needs 4 nodes.*--pack auto"):
        pack([task("wide", 4, 10), task("narrow", 1, 10)], 2)
    with pytest.raises(DdlbenchError, match=r"point long may run 50 s.*over the 40 s"):
        pack([task("long", 1, 50)], 2, max_time_s=40)
    with pytest.raises(DdlbenchError, match="at least 1 node"):
        pack([task("a", 1, 1)], 0)


@pytest.mark.parametrize("seed", range(25))
def test_random_plans_are_valid_greedy_schedules(seed):
    rng = random.Random(seed)
    nodes = rng.choice([1, 2, 4, 7, 16])
    tasks = []
    for i in range(rng.randint(1, 60)):
        width = rng.choice([w for w in (1, 2, 3, 4, 8, 16) if w <= nodes])
        limit = rng.choice([5.0, 10.0, 30.0, 60.0, 61.5])
        tasks.append(task(f"t{i}", width, limit, expected=limit * rng.uniform(0.1, 1.0)))
    max_time = rng.choice([None, 61.5, 150.0])
    packing = pack(tasks, nodes, max_time_s=max_time)
    placed = [t.key for a in packing.allocations for t in a.order]
    assert sorted(placed) == sorted(t.key for t in tasks)  # every point once
    by_key = {t.key: t for t in tasks}
    for allocation in packing.allocations:
        if max_time is not None:
            assert allocation.worst.makespan_s <= max_time + 1e-9
        assert list(allocation.order) == sorted(allocation.order, key=priority)
        for schedule in (allocation.worst, allocation.expected):
            placements = schedule.placements
            assert {p.key for p in placements} == {t.key for t in allocation.order}
            events = sorted({p.start_s for p in placements} | {p.end_s for p in placements})
            for moment in events:
                busy = [s for p in placements if p.start_s <= moment < p.end_s for s in p.slots]
                assert len(busy) == len(set(busy)) <= allocation.nodes  # no node twice at once
            for p in placements:
                assert len(p.slots) == by_key[p.key].nodes
                assert p.end_s - p.start_s == pytest.approx(by_key[p.key].duration(schedule.which))
                # greedy: at no moment while it waited were its nodes free once that moment's starts were made
                for moment in (m for m in events if m < p.start_s):
                    busy = sum(len(q.slots) for q in placements if q.start_s <= moment < q.end_s)
                    assert allocation.nodes - busy < by_key[p.key].nodes, (p, moment)
        assert allocation.expected.makespan_s >= allocation.lower_bound_s - 1e-9
        assert 0 <= allocation.idle_share < 1


def test_the_same_durations_give_the_same_schedule_either_way():
    tasks = [task(f"t{i}", 1 + i % 3, 10 + i) for i in range(12)]
    (allocation,) = pack(tasks, 4).allocations
    assert [(p.key, p.start_s, p.slots) for p in allocation.worst.placements] == [
        (p.key, p.start_s, p.slots) for p in allocation.expected.placements
    ]
    again, deferred = simulate(allocation.order, [f"#{i}" for i in range(4)], which="limit")
    assert again == allocation.worst and deferred == []


def test_pinned_points_run_one_at_a_time_where_their_nodes_share_hardware():
    tasks = [task(f"{n}-0", 1, 10, node=n) for n in ("n1", "n2", "n3")]
    side_by_side = pack(tasks, 3).allocations[0]
    assert {p.start_s for p in side_by_side.expected.placements} == {0}
    (serial,) = pack(tasks, 3, pinned_serial=True).allocations
    assert serial.serial and sorted(p.start_s for p in serial.expected.placements) == [0, 10, 20]


def test_an_allocation_held_takes_every_point_by_the_same_rule_and_the_late_ones_last():
    # 2 nodes, 50 s left: the wide point, then the pinned and the free one side by side; "late" would end
    # after 50 s at its limit, so it comes back to be started last, only if time is left then
    tasks = [task("late", 1, 31), task("pin", 1, 20, node="n2"), task("wide", 2, 20), task("free", 1, 25)]
    allocation, deferred = pack_into(tasks, ["n1", "n2"], max_time_s=50)
    assert [t.key for t in allocation.order] == ["wide", "free", "pin"] and [t.key for t in deferred] == ["late"]
    starts = {p.key: (p.start_s, p.slots) for p in allocation.worst.placements}
    assert starts == {"wide": (0, ("n1", "n2")), "free": (20, ("n1",)), "pin": (20, ("n2",))}
    with pytest.raises(DdlbenchError, match=r"point wide needs 2 nodes; this allocation has 1"):
        pack_into(tasks, ["n1"], max_time_s=None)
    with pytest.raises(DdlbenchError, match=r"points pinned to n2: not in this allocation \(n1,n3\)"):
        pack_into([task("pin", 1, 20, node="n2")], ["n1", "n3"], max_time_s=None)
    serial, _ = pack_into(tasks, ["n1", "n2"], max_time_s=None, serial=True)
    assert sorted(p.start_s for p in serial.worst.placements) == [0, 20, 51, 76]


def test_plan_pack_prints_the_packing_with_predicted_times_where_a_machine_file_exists(write_sweep):
    common = dict(models=["resnet8"], datasets=["cifar10"], strategies=["ddp"], nodes=[1, 2], ranks_per_node=[1],
                  batch_size=[8, 16], warmup_steps=1, steps=20, timeout_s=120)  # fmt: skip
    bare = run_cli("plan", "--configfile", str(write_sweep("bare.yaml", **common)), "--pack", "2", "--format", "json")
    assert bare.returncode == 0, bare.stderr
    (allocation,) = json.loads(bare.stdout)["allocations"]
    # no machine file: every point at its limit (120 s + the launch allowance), the 2-node ones first
    assert [p["end_s"] - p["start_s"] for p in allocation["placements"]] == [150.0] * 4
    assert [len(p["slots"]) for p in allocation["placements"]] == [2, 2, 1, 1]
    machine = REPO / "workflow" / "machines" / "dgx_h100_4ndr.yaml"
    sweep_file = write_sweep("machine.yaml", **common, machine=str(machine))
    predicted = run_cli("plan", "--configfile", str(sweep_file), "--pack", "2", "--max-time", "5")
    assert predicted.returncode == 0, predicted.stderr
    assert f"expected times: predicted on {machine}" in predicted.stdout
    rows = [line.split() for line in predicted.stdout.splitlines() if line.split()[:2] == ["0", "2"]]  # allocation 0
    limit_s, makespan_s = float(rows[0][3]), float(rows[0][4])
    assert makespan_s < limit_s  # a resnet8 step on an H100 node is far shorter than its timeout
    refused = run_cli("plan", "--configfile", str(sweep_file), "--pack", "0")
    assert refused.returncode != 0 and "--pack 0 is not accepted" in refused.stderr
