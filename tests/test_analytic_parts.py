"""The analytical model's parts: the step simulator, pipeline orders against torch's, collective costs."""

from __future__ import annotations

import math

import pytest

from ddlbench.analysis.analytic.machine_model import MachineModel, bus_share, ring_steps
from ddlbench.analysis.analytic.memory import backward_peak
from ddlbench.analysis.analytic.pipelines import (
    Action,
    accumulation_bytes,
    in_flight,
    interleaved_order,
    single_stage_order,
)
from ddlbench.analysis.analytic.simulate import Program, simulate
from ddlbench.analysis.analytic.table_cache import find_table


def test_a_collective_issued_during_backward_hides_under_the_rest_of_it():
    program = Program()
    first = program.compute(0, 1.0, label="B1")
    program.compute(0, 2.0, label="B0")
    reduce = program.comm(0, 1.5, deps=(first,), label="all_reduce")
    program.compute(0, 0.5, deps=(reduce,), label="update")
    timeline = simulate(program)
    assert timeline.step_s == pytest.approx(3.5)  # the all-reduce ends at 2.5, under B0 (ends at 3.0)
    serial = simulate(program, overlap=False)  # no core for the communication thread: nothing hides
    assert serial.step_s == pytest.approx(5.0)
    assert serial.ranks[0].exposed_comm_s == pytest.approx(1.5)
    rank = timeline.ranks[0]
    assert (rank.compute_s, rank.exposed_comm_s, rank.hidden_comm_s) == pytest.approx((3.5, 0.0, 1.5))


def test_a_collective_in_flight_slows_its_ranks_compute_by_the_measured_share():
    """A CPU rank's collective runs on the rank's own cores: its compute advances at 1 − share while it is in
    flight. B0 (2 s) runs beside the all-reduce (1.5 s, from 1.0 to 2.5) at 1 − share, the rest at full speed."""
    program = Program()
    first = program.compute(0, 1.0, label="B1")
    program.compute(0, 2.0, label="B0")
    reduce = program.comm(0, 1.5, deps=(first,), label="all_reduce")
    program.compute(0, 0.5, deps=(reduce,), label="update")
    for share in (0.0, 0.25, 0.5, 1.0):
        timeline = simulate(program, comm_share=share)
        # B0 gets (1 − share) × 1.5 s of work done beside the all-reduce, the rest after it
        b0_end = 2.5 + (2.0 - (1 - share) * 1.5)
        assert timeline.step_s == pytest.approx(b0_end + 0.5)
        rank = timeline.ranks[0]
        assert (rank.compute_s, rank.exposed_comm_s, rank.hidden_comm_s) == pytest.approx((b0_end + 0.5, 0.0, 1.5))
    # the two ends: no share is the free overlap, the whole share the serial step
    assert simulate(program, comm_share=0.0).step_s == pytest.approx(simulate(program).step_s)
    assert simulate(program, comm_share=1.0).step_s == pytest.approx(simulate(program, overlap=False).step_s)
    with pytest.raises(ValueError, match=r"comm_share is a share of the rank's cores, from 0 to 1, not 1\.5"):
        simulate(program, comm_share=1.5)


def test_a_collective_beside_compute_runs_stretched_and_slows_the_compute_by_its_in_flight_share():
    """The cores go both ways: with comm_stretch k the all-reduce (1.5 s alone, from 1.0) advances at 1 / k of its
    rate while B0 (2 s) computes, and B0 at 1 − share while the all-reduce is in flight. share 0.3, k 2: under B0
    the all-reduce would take 3 s and B0 beside it 2 / 0.7 = 2.857 s, so B0 ends first, at 3.857, with 2.857 / 3 of
    the all-reduce done; its last 1.5 × (1 − 2.857 / 3) s run at full speed, exposed, then the update (0.5 s)."""
    program = Program()
    first = program.compute(0, 1.0, label="B1")
    program.compute(0, 2.0, label="B0")
    reduce = program.comm(0, 1.5, deps=(first,), label="all_reduce")
    program.compute(0, 0.5, deps=(reduce,), label="update")
    b0 = 2.0 / 0.7
    tail = 1.5 * (1 - b0 / 3.0)
    timeline = simulate(program, comm_share=0.3, comm_stretch=2.0)
    assert timeline.step_s == pytest.approx(1.0 + b0 + tail + 0.5)
    rank = timeline.ranks[0]
    # the collective's time is what it ran, stretched: not its price alone
    assert (rank.compute_s, rank.exposed_comm_s, rank.comm_s) == pytest.approx((1.0 + b0 + 0.5, tail, b0 + tail))
    # a collective named on its op takes its own figures from comm_beside; the machine's pair prices the others
    named = Program()
    first = named.compute(0, 1.0, label="B1")
    named.compute(0, 2.0, label="B0")
    reduce = named.comm(0, 1.5, deps=(first,), label="all_reduce", collective="all_reduce")
    named.compute(0, 0.5, deps=(reduce,), label="update")
    own = simulate(named, comm_share=0.9, comm_stretch=1.0, comm_beside={"all_reduce": (0.3, 2.0)})
    assert own.step_s == pytest.approx(timeline.step_s)
    other = simulate(named, comm_share=0.3, comm_stretch=2.0, comm_beside={"reduce_scatter": (0.9, 1.0)})
    assert other.step_s == pytest.approx(timeline.step_s)
    with pytest.raises(ValueError, match=r"comm_beside\['all_reduce'\] is a share from 0 to 1"):
        simulate(named, comm_share=0.3, comm_beside={"all_reduce": (1.2, 2.0)})
    # a stretch of 1 is the share alone; a stretch below 1, or without a share, is refused by name
    assert simulate(program, comm_share=0.3, comm_stretch=1.0).step_s == pytest.approx(
        simulate(program, comm_share=0.3).step_s
    )
    with pytest.raises(ValueError, match=r"comm_stretch is at least 1, and only beside a comm_share, not 0\.5"):
        simulate(program, comm_share=0.3, comm_stretch=0.5)
    with pytest.raises(ValueError, match=r"comm_stretch is at least 1, and only beside a comm_share, not 2\.0"):
        simulate(program, comm_stretch=2.0)


def test_a_collective_with_nothing_to_hide_behind_is_exposed_whatever_the_share():
    program = Program()
    backward = program.compute(0, 1.0)
    reduce = program.comm(0, 2.0, deps=(backward,))
    program.compute(0, 0.5, deps=(reduce,))
    for share in (0.0, 0.7, 1.0):
        rank = simulate(program, comm_share=share).ranks[0]
        assert (rank.compute_s, rank.exposed_comm_s) == pytest.approx((1.5, 2.0))


def test_a_collective_longer_than_the_compute_left_is_exposed_by_the_difference():
    program = Program()
    first = program.compute(0, 1.0)
    program.compute(0, 1.0)
    reduce = program.comm(0, 3.0, deps=(first,))
    program.compute(0, 0.5, deps=(reduce,))
    timeline = simulate(program)
    rank = timeline.ranks[0]
    assert timeline.step_s == pytest.approx(4.5)
    assert rank.exposed_comm_s == pytest.approx(2.0)
    assert rank.compute_s + rank.exposed_comm_s + rank.bubble_s == pytest.approx(timeline.step_s)


def test_a_rank_waiting_on_another_ranks_compute_counts_it_as_bubble():
    program = Program()
    upstream = program.compute(0, 2.0)
    transfer = program.comm(1, 0.5, deps=(upstream,))
    program.compute(1, 1.0, deps=(transfer,))
    timeline = simulate(program)
    rank1 = timeline.ranks[1]
    assert timeline.step_s == pytest.approx(3.5)
    assert (rank1.exposed_comm_s, rank1.bubble_s) == pytest.approx((0.5, 2.0))


def test_ops_waiting_on_each_other_are_refused():
    program = Program()
    a = program.compute(0, 1.0)
    b = program.compute(1, 1.0, deps=(a,))
    program.ops[a].deps = (b,)
    with pytest.raises(ValueError, match="wait on each other"):
        simulate(program)


@pytest.mark.parametrize(("ranks", "micro"), [(2, 2), (2, 4), (4, 4), (4, 8), (3, 6), (2, 6)])
def test_interleaved_order_is_torchs(ranks, micro):
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

    schedule = object.__new__(ScheduleInterleaved1F1B)  # the order only: no stages, no process group
    schedule.pp_group_size, schedule.n_local_stages, schedule._n_microbatches = ranks, 2, micro
    schedule.number_of_rounds = max(1, micro // ranks)
    schedule.microbatches_per_round = micro // schedule.number_of_rounds
    for rank in range(ranks):
        theirs = [
            Action("F" if a.computation_type == _ComputationType.FORWARD else "B", a.stage_index, a.microbatch_index)
            for a in schedule._calculate_single_rank_operations(rank)
            if a is not None
        ]
        assert interleaved_order(rank, ranks, 2, micro) == theirs


def test_gpipe_keeps_every_micro_batch_and_1f1b_at_most_the_stages_left():
    for stage in range(4):
        assert in_flight(single_stage_order("gpipe", stage, 4, 8), stage) == 8
        assert in_flight(single_stage_order("1f1b", stage, 4, 8), stage) == 4 - stage
        order = single_stage_order("1f1b", stage, 4, 8)
        assert sorted(order, key=lambda a: (a.kind, a.micro)) == sorted(
            [Action(k, stage, m) for k in "FB" for m in range(8)], key=lambda a: (a.kind, a.micro)
        )


def test_the_gpipe_bubble_matches_the_closed_form():
    """Equal stages, free transfers: the step is (m + S − 1)(t_f + t_b) and each rank idles (S − 1)(t_f + t_b)."""
    stages, micro, tf, tb = 4, 8, 1.0, 2.0
    program = Program()
    ops = {}
    for s in range(stages):
        for action in single_stage_order("gpipe", s, stages, micro):
            ops[action] = program.compute(s, tf if action.kind == "F" else tb)
    for action, op in ops.items():
        if action.kind == "F" and action.stage > 0:
            program.ops[op].deps = (ops[Action("F", action.stage - 1, action.micro)],)
        if action.kind == "B" and action.stage < stages - 1:
            program.ops[op].deps = (ops[Action("B", action.stage + 1, action.micro)],)
    alone = simulate(program, steps=1)
    assert alone.step_s == pytest.approx((micro + stages - 1) * (tf + tb))
    assert alone.mean("bubble_s") == pytest.approx((stages - 1) * (tf + tb))
    # back to back, as ddlbench runs steps (no barrier between them): the last stage ends its step
    # (S − 1)·t_b before the first and starts the next one that much earlier, and a step is measured from
    # the earliest start to the latest end over ranks
    running = simulate(program)
    assert running.step_s == pytest.approx((micro + stages - 1) * (tf + tb) + (stages - 1) * tb)


def test_ranks_sharing_a_host_pay_the_shared_price_only_while_both_compute():
    """Rank 0's op (alone 1 s, 2 s with the other rank computing) runs alone for 0.5 s, until rank 1's op
    (the same prices) starts: both then advance at half speed. Rank 0 has 0.5 of its work left, done at
    1.5 s; rank 1 has done 0.5 of its work by then, and ends the rest alone at 2.0 s. List scheduling at the
    shared price ends them at 2.0 and 2.5, at the alone price at 1.0 and 1.5."""
    program = Program(hosts={0: 0, 1: 0})
    gate = program.comm(1, 0.5, label="recv")
    program.compute(0, 2.0, alone_s=1.0, label="rank 0's")
    program.compute(1, 2.0, alone_s=1.0, deps=(gate,), label="rank 1's")
    timeline = simulate(program, steps=1)
    ends = [next(op.end_s for op in timeline.ops if op.label == label) for label in ("rank 0's", "rank 1's")]
    assert ends == pytest.approx([1.5, 2.0])
    assert timeline.step_s == pytest.approx(2.0)
    # the compute a rank reports is what it paid: 1.5 s each, between the alone and shared prices
    assert [rank.compute_s for rank in timeline.ranks] == pytest.approx([1.5, 1.5])
    # ranks on hosts of their own never slow each other
    program.hosts = {0: 0, 1: 1}
    apart = simulate(program, steps=1).ops
    assert [next(op.end_s for op in apart if op.label == label) for label in ("rank 0's", "rank 1's")] == (
        pytest.approx([1.0, 1.5])
    )


def test_three_ranks_of_a_host_pay_a_price_between_alone_and_all_at_once():
    """With k ranks on a host, j of them computing: alone + (shared − alone)·(j − 1)/(k − 1). Two of three
    computing from the start: each at 1.5 s for its 1 s alone / 2 s shared op."""
    program = Program(hosts={0: 0, 1: 0, 2: 0})
    for rank in (0, 1):
        program.compute(rank, 2.0, alone_s=1.0, label="two of three")
    program.comm(2, 0.0)  # the third rank only waits
    timeline = simulate(program, steps=1)
    assert [op.end_s for op in timeline.ops if op.label == "two of three"] == pytest.approx([1.5, 1.5])


def test_without_second_prices_the_fluid_simulation_is_list_scheduling():
    """A program with hosts but one price per op runs exactly as before; so does one whose ops' two prices
    are equal (the fluid path is taken and must agree with list scheduling)."""
    from ddlbench.analysis.analytic import simulate as module

    def pipeline(hosts: dict[int, int], second: bool) -> Program:
        program = Program(hosts=hosts)
        ops = {}
        for s in range(3):
            for action in single_stage_order("1f1b", s, 3, 4):
                t = 1.0 + 0.3 * s if action.kind == "F" else 2.0 + 0.1 * action.micro
                ops[action] = program.compute(s, t, alone_s=t if second else None)
        for action, op in ops.items():
            if action.kind == "F" and action.stage > 0:
                recv = program.comm(action.stage, 0.2, deps=(ops[Action("F", action.stage - 1, action.micro)],))
                program.ops[op].deps = (recv,)
            if action.kind == "B" and action.stage < 2:
                program.ops[op].deps = (ops[Action("B", action.stage + 1, action.micro)],)
        return program

    plain = simulate(pipeline({}, False))
    fluid_program = pipeline({0: 0, 1: 0, 2: 0}, True)
    listed, fluid = [], []
    original = module._run
    module._run = lambda ops: listed.append(1) or original(ops)
    original_shared = module._run_shared
    module._run_shared = lambda ops, hosts: fluid.append(1) or original_shared(ops, hosts)
    try:
        same = simulate(fluid_program)
    finally:
        module._run, module._run_shared = original, original_shared
    assert listed == [1] and fluid == []  # equal prices everywhere: nothing to contend for, list scheduling
    fluid_program.ops[0].alone_s = fluid_program.ops[0].duration_s * (1 - 1e-9)  # forces the fluid path
    forced = simulate(fluid_program)
    assert same.step_s == pytest.approx(plain.step_s, rel=1e-12)
    assert forced.step_s == pytest.approx(plain.step_s, rel=1e-6)
    assert [op.start_s for op in forced.ops] == pytest.approx([op.start_s for op in plain.ops], rel=1e-6)


MACHINE = {
    "name": "t",
    "source": "measured",
    "device": {"kind": "cpu", "per_node": 2, "memory_bytes": 8e9},
    "compute": {"matmul_flop_per_s": {"fp32": {"value": 1e10}}, "memory_bandwidth_bytes_per_s": {"value": 1e10}},
    "links": {"intra_node": {"alpha_s": 1e-5, "beta_s_per_byte": 1e-9}},
    "collectives": [
        {"library": "gloo", "op": "all_reduce", "ranks": 2, "nodes": 1, "alpha_s": 2e-3, "beta_s_per_byte": 1e-9},
        {
            "library": "mpi (Open MPI)",
            "op": "all_reduce",
            "ranks": 2,
            "nodes": 1,
            "alpha_s": 5e-6,
            "beta_s_per_byte": 5e-10,
        },
    ],
}


def test_a_measured_fit_is_used_as_it_is_and_gloo_is_preferred_on_a_cpu():
    cost = MachineModel.from_dict(MACHINE).collective("all_reduce", ranks=2, nodes=1)
    assert cost.time_s(1e6) == pytest.approx(2e-3 + 1e-3)
    assert "gloo" in cost.source


def test_a_fit_that_resolved_no_bandwidth_gives_way_and_says_so_when_alone():
    machine = dict(MACHINE, collectives=[dict(c) for c in MACHINE["collectives"]])
    machine["collectives"][0].update(beta_s_per_byte=0.0, clamped="beta")  # gloo's slope came out negative
    cost = MachineModel.from_dict(machine).collective("all_reduce", ranks=2, nodes=1)
    assert "mpi" in cost.source and cost.time_s(1e6) == pytest.approx(5e-6 + 5e-4)
    machine["collectives"] = machine["collectives"][:1]
    cost = MachineModel.from_dict(machine).collective("all_reduce", ranks=2, nodes=1)
    assert cost.time_s(1e6) == cost.time_s(1) == pytest.approx(2e-3) and "no bandwidth" in cost.source


def test_a_fit_moves_to_other_group_sizes_by_the_ring_algorithm():
    cost = MachineModel.from_dict(MACHINE).collective("all_reduce", ranks=8, nodes=1)
    # at p=2: 2 steps of α/2 each, bus share 1 → β per bus byte 1e-9; at p=8: 14 steps, share 7/4
    assert cost.alpha_s == pytest.approx(14 * 1e-3)
    assert cost.beta_s_per_byte == pytest.approx(1.75e-9)
    assert ring_steps("all_gather", 8) == 7 and bus_share("all_gather", 8) == pytest.approx(7 / 8)
    assert ring_steps("broadcast", 8) == math.ceil(math.log2(8))


def test_without_a_fit_the_link_is_costed_by_the_ring_formula():
    cost = MachineModel.from_dict(MACHINE).collective("reduce_scatter", ranks=4, nodes=1)
    assert cost.time_s(4e6) == pytest.approx(3 * 1e-5 + 0.75 * 4e6 * 1e-9)
    assert "link" in cost.source


def test_the_backward_walk_peaks_where_activations_and_gradients_meet():
    # two blocks: saved 10 and 4, gradients 1 and 100, nothing flowing
    peak, kept = backward_peak([10, 4], [1, 100], [0, 0])
    assert kept == 14
    assert peak == 114  # during block 1's backward: both blocks' activations and its 100 B of gradients


def test_a_later_micro_batch_holds_a_linears_new_gradient_once_and_a_convolutions_twice():
    """What a pipeline stage's later micro-batch holds beside .grad while it adds a weight gradient in: the
    largest of a convolution's weight twice (its gradient and oneDNN's blocked buffer) and any other weight
    once. vgg11 on ImageNet: its classifier's 25,088 → 4,096 Linear once (411 MB); its convolutions alone,
    the 512 → 512 3×3 weight twice (2 × 9.4 MB)."""
    table = find_table("vgg11", "imagenet", (("norm", "batch"),))
    linear = max((layer for layer in table.layers if layer.type == "Linear"), key=lambda layer: layer.params)
    convs = [layer for layer in table.layers if layer.type == "Conv2d"]
    conv_blocks = range(0, max(layer.block for layer in convs) + 1)
    assert not any(layer.type == "Linear" for layer in table.layers if layer.block in conv_blocks)
    assert accumulation_bytes(table, range(len(table.blocks))) == 4 * 25088 * 4096 == 4 * math.prod(linear.weight_shape)
    assert accumulation_bytes(table, range(linear.block, linear.block + 1)) == 4 * 25088 * 4096
    assert accumulation_bytes(table, conv_blocks) == 2 * 4 * 512 * 512 * 9
