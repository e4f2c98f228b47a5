"""The analytical model on real model tables: strategies, memory, the oracle, the CLI, the accuracy figures."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from ddlbench.analysis.analytic.accuracy import (
    accuracy,
    by_strategy,
    join,
    overall,
    per_configuration,
    time_accuracy_interval,
)
from ddlbench.analysis.analytic.layout import Context, Setting
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.oracle import consult
from ddlbench.analysis.analytic.predict import CSV_COLUMNS, introspected_table, predict, resolved_options
from ddlbench.train.strategies.sharded import DEFAULT_BUCKET_CAP_MB

REPO = Path(__file__).resolve().parents[1]
H100 = REPO / "workflow" / "machines" / "dgx_h100_4ndr.yaml"


def cpu_machine(**changes) -> MachineModel:
    data = {
        "name": "cpu",
        "source": "measured",
        "device": {"kind": "cpu", "per_node": 2, "memory_bytes": 16e9, "threads_per_rank": 1},
        "compute": {
            "matmul_flop_per_s": {"fp32": {"value": 5e10}},
            "conv_flop_per_s": {"fp32": {"value": 3e10}},
            "memory_bandwidth_bytes_per_s": {"value": 1e10},
        },
        "links": {"intra_node": {"alpha_s": 2e-4, "beta_s_per_byte": 5e-10}},
        "collectives": [],
    }
    data.update(changes)
    return MachineModel.from_dict(data)


def setting(strategy: str, **changes) -> Setting:
    base = dict(
        model="resnet20", dataset="cifar10", strategy=strategy, nodes=1, ranks_per_node=2, batch_size=32, split=1
    )
    if strategy in ("gpipe", "1f1b", "interleaved_1f1b", "model_parallel", "filter", "channel", "spatial", "tensor"):
        base["split"] = 2
    if strategy in ("gpipe", "1f1b", "interleaved_1f1b"):
        base["micro_batches"] = 4
    base.update(changes)
    return Setting(**base)


def test_one_rank_has_nothing_to_communicate_and_two_pay_for_their_gradients():
    machine = cpu_machine()
    alone = predict(setting("ddp", ranks_per_node=1), machine, search_batch=False)
    pair = predict(setting("ddp"), machine, search_batch=False)
    assert alone.comm_s == 0 and alone.step_time_s == pytest.approx(alone.compute_s)
    # every gradient crosses once per step: a ring all-reduce of 2 ranks sends each byte once
    table = introspected_table("resnet20", "cifar10", (("norm", "batch"),))
    assert pair.comm_s >= table.param_bytes * 5e-10
    assert pair.step_time_s == pytest.approx(pair.compute_s + pair.comm_exposed_s + pair.bubble_s)
    assert pair.samples_per_s == pytest.approx(64 / pair.step_time_s)


def test_ddps_reducer_copies_every_gradient_into_its_bucket_and_back():
    """torch DDP (gradient_as_bucket_view off) copies each gradient into its bucket and back once reduced:
    two passes over the parameters, each at least their bytes read and written over the memory bandwidth
    (vgg11 on 3×160² at one rank, 2026-12-06: DDP's backward 170-190 ms longer than the plain model's for
    515 MB of gradients, a copy of them 88 ms; gloo's all-reduce on a group of one took 0.3 ms for 400 MiB).
    Horovod's model, with the same passes and update and no buckets, is the step without them."""
    table = introspected_table("vgg11", "cifar10", (("norm", "batch"),))
    for bandwidth in (1e10, 2.5e9):
        compute = {
            "matmul_flop_per_s": {"fp32": {"value": 5e10}},
            "conv_flop_per_s": {"fp32": {"value": 3e10}},
            "memory_bandwidth_bytes_per_s": {"value": bandwidth},
        }
        machine = cpu_machine(compute=compute)
        ddp, horovod = (
            predict(setting(strategy, model="vgg11", ranks_per_node=1, batch_size=2), machine, search_batch=False)
            for strategy in ("ddp", "horovod")
        )
        # an operator-free machine costs a pass as an add, 3 fp32 values an element, by the bandwidth
        assert ddp.step_time_s - horovod.step_time_s == pytest.approx(2 * 3 * 4 * table.params / bandwidth, rel=1e-6)


def test_a_slower_network_exposes_more_of_the_all_reduce():
    fast = predict(setting("ddp"), cpu_machine(), search_batch=False)
    slow = predict(
        setting("ddp"),
        cpu_machine(links={"intra_node": {"alpha_s": 2e-4, "beta_s_per_byte": 5e-7}}),
        search_batch=False,
    )
    assert slow.comm_exposed_s > fast.comm_exposed_s
    assert slow.compute_s == pytest.approx(fast.compute_s)


def test_ddps_buckets_are_copied_as_their_gradients_are_ready_and_reduced_under_the_rest_of_backward():
    """DDP's reducer copies a gradient into its bucket on the backward's own thread as soon as it is ready, and the
    bucket's all-reduce starts then: a classifier's buckets (its gradients come first) are reduced while the
    convolutions' backward goes on. Each copy starts where its bucket's last block's backward ends, and the first
    large bucket's all-reduce ends before the backward does (a core to spare: nothing slows either)."""
    from ddlbench.analysis.analytic.data_parallel import model_ddp, plan_buckets
    from ddlbench.analysis.analytic.predict import block_times

    machine = replace(cpu_machine(), per_node=8)
    point = setting("ddp", model="alexnet", dataset="imagenet128", batch_size=2)
    table = introspected_table(point.model, point.dataset, resolved_options(point))
    ctx = Context(setting=point, table=table, machine=machine, sharing=2)
    times = block_times(table, machine, batch=2, precision="fp32", threads=1, sharing=2)
    ops = {op.label: op for op in model_ddp(ctx, times).timeline.ops if op.rank == 0}
    buckets = plan_buckets(ctx, float(point.option("bucket_cap_mb")) * 2**20, first_cap_bytes=2**20)
    assert len(buckets) >= 3
    for k, bucket in enumerate(buckets):
        assert ops[f"into bucket {k}"].start_s == pytest.approx(ops[f"B{bucket.ready_block}"].end_s)
        assert ops[f"all_reduce {k}"].start_s >= ops[f"into bucket {k}"].end_s - 1e-12
    early = next(k for k, b in enumerate(buckets) if b.bytes >= 2**24 and b.ready_block > 0)
    assert ops[f"all_reduce {early}"].end_s < ops["B0"].end_s


def test_two_cpu_ranks_hide_their_collectives_in_part_by_the_calibrations_beside_share():
    """Two ranks on two cores leave no core over: without the calibration's beside share the collectives run
    unhidden in the compute stream; with it they keep their lane and slow the compute they overlap by that
    share, so the step lies between the free overlap (share 0: a machine with cores to spare) and the
    serial step (share 1), and meets each at its end."""
    machine = cpu_machine()
    spare = replace(machine, per_node=8)  # the rule without a share: a core left over hides them for free
    for strategy in ("ddp", "zero2"):
        point = setting(strategy, model="resnet18", batch_size=8)  # buckets reduced while backward goes on
        serial, free = (predict(point, m, search_batch=False).step_time_s for m in (machine, spare))
        steps = {
            share: predict(point, replace(machine, comm_share=share), search_batch=False) for share in (0.0, 0.5, 1.0)
        }
        assert free < serial
        assert steps[0.0].step_time_s == pytest.approx(free)
        assert steps[1.0].step_time_s == pytest.approx(serial)
        assert free < steps[0.5].step_time_s < serial
        assert any("beside share, 0.50" in note for note in steps[0.5].notes)
        # the collectives' own prices do not change: only what they take from the compute beside them
        assert steps[0.5].comm_s == pytest.approx(steps[1.0].comm_s)


def test_the_machines_comm_share_is_the_median_of_its_collectives_kept_within_0_and_1():
    def machine(*shares):
        entries = [{"op": "all_reduce", "beside": {"share": {"value": share, "n": 20}}} for share in shares]
        return cpu_machine(collectives=[*entries, {"op": "broadcast"}])

    assert machine(0.56, 0.8, 0.73, 1.4).comm_share == pytest.approx(0.765)
    assert machine(0.56, 0.8, 0.73).comm_share == pytest.approx(0.73)
    assert machine(1.2, 1.5).comm_share == 1.0 and machine(-0.1).comm_share == 0.0
    assert machine().comm_share is None and cpu_machine().comm_share is None


def test_a_calibration_that_timed_its_collectives_beside_compute_gives_their_in_flight_share_and_stretch():
    """Where the beside figures time the collective under the chain too, the machine's share is their
    in_flight_share (the chain's loss per second the collective ran under it), not the share per second alone,
    and its stretch their median stretch, at least 1; each collective keeps its own pair (the median over its
    layouts); an older file's has no stretch and keeps its share."""

    def entry(op, share, in_flight, stretch):
        figures = {"share": {"value": share}, "in_flight_share": {"value": in_flight}, "stretch": {"value": stretch}}
        return {"op": op, "beside": figures}

    both = cpu_machine(
        collectives=[
            entry("all_reduce", 0.53, 0.34, 1.99),
            entry("all_reduce", 0.74, 0.36, 2.10),
            entry("reduce_scatter", 0.52, 0.12, 5.08),
            {"op": "broadcast"},
        ]
    )
    assert both.comm_share == pytest.approx(0.34) and both.comm_stretch == pytest.approx(2.10)
    assert both.comm_beside["all_reduce"] == pytest.approx((0.35, 2.045))
    assert both.comm_beside["reduce_scatter"] == pytest.approx((0.12, 5.08))
    assert set(both.comm_beside) == {"all_reduce", "reduce_scatter"}
    noise = cpu_machine(collectives=[entry("all_gather", 0.5, 0.4, 0.8)])  # faster beside compute: noise
    assert noise.comm_stretch == 1.0 and noise.comm_beside["all_gather"] == pytest.approx((0.4, 1.0))
    older = cpu_machine(collectives=[{"op": "all_reduce", "beside": {"share": {"value": 0.66}}}])
    assert older.comm_share == pytest.approx(0.66) and older.comm_stretch is None
    assert older.comm_beside == {"all_reduce": pytest.approx((0.66, None))}


def test_zero_and_fsdp_memory_follow_the_zero_papers_per_rank_state():
    """Rajbhandari et al.: with momentum SGD (one state per parameter), per rank and p ranks, DDP keeps
    parameters, gradients and state whole, ZeRO-2 shards gradients and state, FSDP (ZeRO-3) all three."""
    machine = cpu_machine()
    table = introspected_table("resnet20", "cifar10", (("norm", "batch"),))
    P = table.param_bytes
    for p in (2, 4):
        ddp = predict(setting("ddp", ranks_per_node=p), machine, search_batch=False)
        zero2 = predict(setting("zero2", ranks_per_node=p), machine, search_batch=False)
        fsdp = predict(setting("fsdp", ranks_per_node=p), machine, search_batch=False)
        assert (ddp.params_bytes - table.buffer_bytes, ddp.grads_bytes, ddp.optimizer_bytes) == (P, P, P)
        assert (zero2.grads_bytes, zero2.optimizer_bytes) == pytest.approx((P / p, P / p), abs=1)
        assert (fsdp.params_bytes - table.buffer_bytes, fsdp.optimizer_bytes) == pytest.approx((P / p, P / p), abs=1)
        assert fsdp.resident_memory_bytes < zero2.resident_memory_bytes < ddp.resident_memory_bytes


@pytest.mark.parametrize(
    ("model", "dataset"), [("alexnet", "imagenette"), ("resnet34", "imagenette"), ("wide_resnet50_2", "stl10")]
)
def test_zero2s_buckets_are_cut_as_its_trainer_cuts_them(model, dataset):
    """The model's zero2 buckets (from the table) hold the elements the trainer's do (from the real model's
    parameters, on the meta device), in the same order: alexnet's two large Linear weights each alone."""
    import torch

    from ddlbench.analysis.analytic.data_parallel import plan_zero2_buckets
    from ddlbench.train.kernel import build_model
    from ddlbench.train.strategies.sharded import plan_buckets

    point = setting("zero2", model=model, dataset=dataset, batch_size=2)
    with torch.device("meta"):
        module = build_model(point, materialise=False)
    cap = DEFAULT_BUCKET_CAP_MB * 2**20
    trainer = [b.elements for b in plan_buckets([p for p in module.parameters()], int(cap) // 4, 1)]
    table = introspected_table(model, dataset, resolved_options(point))
    ctx = Context(setting=point, table=table, machine=cpu_machine())
    assert [b.bytes // 4 for b in plan_zero2_buckets(ctx, cap)] == trainer
    assert len(trainer) > 1 and sum(trainer) == table.params


def test_zero2_pays_for_its_own_buffers_by_the_parameters_and_the_memory_it_maps_anew():
    """zero2's step copies every gradient into bucket buffers it allocates anew, divides them, clones its shard
    and, on one rank, has gloo copy twice more: on one rank, where ddp does none of it and neither
    communicates, zero2 is slower by passes over the parameters, so by more for vgg11 (9.2 M parameters)
    than for resnet20 (0.27 M). Its buffers are mapped anew, and pay first touches, only where they are
    32 MiB or more (glibc's largest mmap threshold; smaller ones reuse the heap), which a bucket is only for a
    parameter that large: none of vgg11's on CIFAR-10 (9.4 MB at most), its 411 and 67 MB classifier layers
    on ImageNet, five times each on one rank (buffer, shard, the reduce-scatter's temporary, the clone, the
    all-gather's temporary: gloo's temporaries are the whole bucket, tests/test_zero2_memory.py)."""
    per_byte = 2.5e-10
    touched = cpu_machine(compute={**cpu_machine_compute(), "first_touch_s_per_byte": {"value": per_byte}})
    plain = cpu_machine()
    gaps = {}
    for model, dataset in (("resnet20", "cifar10"), ("vgg11", "cifar10"), ("vgg11", "imagenet")):
        for name, machine in (("plain", plain), ("touched", touched)):
            one = dict(model=model, dataset=dataset, ranks_per_node=1, batch_size=2)
            ddp = predict(setting("ddp", **one), machine, search_batch=False)
            zero2 = predict(setting("zero2", **one), machine, search_batch=False)
            assert ddp.comm_s == zero2.comm_s == 0
            gaps[model, dataset, name] = zero2.step_time_s - ddp.step_time_s
    params = {m: introspected_table(m, "cifar10", (("norm", "batch"),)).params for m in ("resnet20", "vgg11")}
    for name in ("plain", "touched"):
        assert gaps["resnet20", "cifar10", name] > 0
        # passes over the parameters: the gap grows as the parameters do (within the elementwise fits' own
        # shape: here the rates' bandwidth, exactly in proportion)
        ratio = gaps["vgg11", "cifar10", name] / gaps["resnet20", "cifar10", name]
        assert ratio == pytest.approx(params["vgg11"] / params["resnet20"])
    for model, dataset in (("resnet20", "cifar10"), ("vgg11", "cifar10")):
        assert gaps[model, dataset, "touched"] == pytest.approx(gaps[model, dataset, "plain"])
    imagenet = introspected_table("vgg11", "imagenet", (("norm", "batch"),))
    mapped = sum(layer.params * 4 for layer in imagenet.layers if layer.params * 4 >= 32 * 2**20)
    assert mapped > 0.85 * imagenet.param_bytes > 4.5e8  # its two largest layers (120 M of 133 M)
    extra = gaps["vgg11", "imagenet", "touched"] - gaps["vgg11", "imagenet", "plain"]
    assert extra == pytest.approx(5 * mapped * per_byte)


ALONE_OPS = ("reduce_scatter", "all_gather")


def alone_figures(per_byte: dict[str, float], sizes=(4 << 20, 384 << 20)) -> dict:
    """A machine file's `alone_collectives`: each op at `sizes`, costing its bytes × its seconds a byte."""
    return {op: [{"bytes": size, "value": size * rate} for size in sizes] for op, rate in per_byte.items()}


def test_a_call_on_a_group_of_one_costs_its_bytes_at_the_rate_measured_near_its_size():
    """The seconds a byte at the probed sizes, interpolated in log(bytes) between them (a call's cost a byte
    changes as it leaves the caches), the nearest size's rate beyond them; nothing where not probed."""
    mib = 1 << 20
    figures = {"all_gather": [{"bytes": 4 * mib, "value": 4e-3}, {"bytes": 64 * mib, "value": 128e-3}]}
    machine = cpu_machine(compute={**cpu_machine_compute(), "alone_collectives": figures})
    assert machine.alone_collective_s("all_gather", 4 * mib) == pytest.approx(4e-3)
    assert machine.alone_collective_s("all_gather", 64 * mib) == pytest.approx(128e-3)
    # 16 MiB is halfway in log between 4 and 64: its rate halfway between 1 and 2 ms a MiB
    assert machine.alone_collective_s("all_gather", 16 * mib) == pytest.approx(16 * 1.5e-3)
    assert machine.alone_collective_s("all_gather", mib) == pytest.approx(1e-3)
    assert machine.alone_collective_s("all_gather", 256 * mib) == pytest.approx(256 * 2e-3)
    assert machine.alone_collective_s("reduce_scatter", 4 * mib) is None
    assert cpu_machine().alone_collective_s("all_gather", 4 * mib) is None


def test_zero2_on_one_rank_costs_gloos_calls_as_the_calibration_timed_them_on_a_group_of_one():
    """With no peer the collectives' fits cost zero2's calls nothing, yet gloo still moves every bucket. Where
    the calibration timed them on a group of one, a one-rank step pays that: the all-gathers follow the update
    with nothing to hide them, so making the calls slower by ΔA seconds in all lengthens the step by at least
    ΔA; the reduce-scatters run on gloo's thread beside backward (one rank leaves a core of two), so by at most
    ΔA + ΔR. The two elementwise passes that stand for the calls where the file has no such figure are dropped,
    and so are the first touches of gloo's two temporaries, which the calls' times hold."""
    one = dict(model="vgg11", dataset="imagenet", ranks_per_node=1, batch_size=2)
    table = introspected_table("vgg11", "imagenet", (("norm", "batch"),))

    def step(machine) -> float:
        return predict(setting("zero2", **one), machine, search_batch=False).step_time_s

    def timed(rate: float, touch: float = 0.0):
        compute = {**cpu_machine_compute(), "first_touch_s_per_byte": {"value": touch}}
        return cpu_machine(compute=compute | {"alone_collectives": alone_figures(dict.fromkeys(ALONE_OPS, rate))})

    slow, fast = 3e-9, 1e-9
    grown = step(timed(slow)) - step(timed(fast))
    gathers = (slow - fast) * table.param_bytes  # every bucket all-gathered once: the parameters' bytes
    assert gathers * 0.99 <= grown <= 2 * gathers * 1.01
    # priced as two passes without the figure: a group of one probed as nearly free is cheaper than that
    assert step(cpu_machine()) > step(timed(1e-15))

    # first touches: 3 of the buffers' 5 where gloo's calls were timed (their temporaries inside), 5 where not
    def gap(machine) -> float:  # zero2's step beyond ddp's, which pays its own first touches alike
        return step(machine) - predict(setting("ddp", **one), machine, search_batch=False).step_time_s

    mapped = sum(layer.params * 4 for layer in table.layers if layer.params * 4 >= 32 * 2**20)
    per_byte = 2.5e-10
    assert gap(timed(fast, per_byte)) - gap(timed(fast)) == pytest.approx(3 * mapped * per_byte, rel=1e-6)


def cpu_machine_compute() -> dict:
    return {
        "matmul_flop_per_s": {"fp32": {"value": 5e10}},
        "conv_flop_per_s": {"fp32": {"value": 3e10}},
        "memory_bandwidth_bytes_per_s": {"value": 1e10},
    }


def test_gpipe_keeps_every_micro_batch_and_1f1b_only_the_stages_worth():
    machine = cpu_machine()
    gpipe = predict(setting("gpipe", micro_batches=8), machine, search_batch=False)
    one_f = predict(setting("1f1b", micro_batches=8), machine, search_batch=False)
    assert one_f.activations_bytes < gpipe.activations_bytes
    assert gpipe.bubble_s > 0 and one_f.bubble_s > 0


def test_a_pipeline_stage_waits_for_its_sends_to_be_received_before_its_step_ends():
    """gloo's send (as NCCL's) completes once the peer has posted the matching recv, and torch's schedules
    wait for their sends before step() returns: the last stage of a GPipe step ends only when the first stage,
    done with micro-batch m − 2's backward, posts its recv for the last micro-batch's gradient. Measured on the
    tenth scoring set's gpipe points (2 stages, 2 micro-batches): the last stage ended its steps 180-325 ms
    before the first, about one backward of the first stage (190-435 ms), not the three a free send allows."""
    machine = cpu_machine()
    table = introspected_table("resnet20", "cifar10", (("norm", "batch"),))
    micro = 4
    ctx = Context(setting=setting("gpipe", micro_batches=micro), table=table, machine=machine, sharing=2)
    from ddlbench.analysis.analytic.predict import run_strategy

    ops = [op for op in run_strategy(ctx).timeline.ops if op.step == 1]

    def op(label: str):
        return next(o for o in ops if o.label == label)

    posted = op(f"B{micro - 2} s0").end_s
    assert op("update r1").start_s >= posted
    assert op(f"sent B{micro - 1} s1").end_s >= posted


def test_pipeline_stages_sharing_a_host_pay_the_shared_price_only_while_another_computes():
    """Two stages on one host: a stage that computes while the other waits runs at its price alone. With
    every block twice as slow shared as alone, the step lies strictly between the pipeline priced alone
    throughout and priced shared throughout; the last stage's update (its gradients scaled, then SGD) runs
    partly beside the first stage's next forwards."""
    from ddlbench.analysis.analytic.compute import block_times
    from ddlbench.analysis.analytic.pipelines import model_pipeline

    machine = cpu_machine()
    table = introspected_table("resnet20", "cifar10", (("norm", "batch"),))
    chosen = setting("gpipe", micro_batches=4)
    ctx = Context(setting=chosen, table=table, machine=machine, sharing=2)
    alone = block_times(table, machine, batch=chosen.batch_size / 4, precision="fp32", threads=1, sharing=1)
    shared = replace(
        alone,
        forward_s=tuple(2 * t for t in alone.forward_s),
        backward_s=tuple(2 * t for t in alone.backward_s),
        loss_s=2 * alone.loss_s,
    )
    both = model_pipeline(ctx, shared, schedule="gpipe", alone=alone).timeline
    all_shared = model_pipeline(ctx, shared, schedule="gpipe").timeline
    all_alone = model_pipeline(ctx, alone, schedule="gpipe").timeline
    assert all_alone.step_s < both.step_s < all_shared.step_s
    # stage 0's first forward runs while stage 1 waits for its input: at the price alone
    first = next(op for op in both.ops if op.label == "F0 s0")
    assert first.end_s - first.start_s == pytest.approx(alone.forward_of(range(*first_stage(ctx))), rel=1e-6)


def first_stage(ctx: Context) -> tuple[int, int]:
    from ddlbench.analysis.analytic.pipelines import cut_stages

    return cut_stages(ctx, 2)[0]


def test_more_micro_batches_shrink_the_bubble_share():
    machine = cpu_machine()
    shares = [
        (p.bubble_s / p.step_time_s)
        for p in (predict(setting("gpipe", micro_batches=m), machine, search_batch=False) for m in (2, 4, 8))
    ]
    assert shares[0] > shares[1] > shares[2]


def test_every_strategy_of_the_zoo_is_modelled():
    machine = cpu_machine()
    cnn = [
        "ddp",
        "horovod",
        "zero2",
        "fsdp",
        "gpipe",
        "1f1b",
        "interleaved_1f1b",
        "model_parallel",
        "filter",
        "channel",
        "spatial",
    ]
    for name in cnn:
        p = predict(setting(name), machine, search_batch=False)
        assert p.step_time_s > 0 and p.peak_memory_bytes > 0, name
    hybrids = [("dp_pp", 2, 4), ("dp_filter", 2, 1), ("dp_spatial", 2, 1)]
    for name, split, micro in hybrids:
        p = predict(setting(name, ranks_per_node=4, split=split, micro_batches=micro), machine, search_batch=False)
        assert p.step_time_s > 0, name
    for name, split in (("tensor", 2), ("dp_tp", 2)):
        p = predict(
            setting(
                name, model="gpt_tiny", dataset="tokens_small", ranks_per_node=4 if name == "dp_tp" else 2, split=split
            ),
            machine,
            search_batch=False,
        )
        assert p.comm_s > 0, name


def test_the_largest_batch_is_the_last_that_fits():
    machine = cpu_machine()
    limit = 200e6
    p = predict(setting("ddp"), machine, memory_per_device=int(limit))
    assert p.max_batch_size and p.max_batch_size > 1
    at = predict(setting("ddp", batch_size=p.max_batch_size), machine, memory_per_device=int(limit), search_batch=False)
    above = predict(
        setting("ddp", batch_size=p.max_batch_size + 1), machine, memory_per_device=int(limit), search_batch=False
    )
    assert at.fits and not above.fits
    assert above.bottleneck == "memory"


def test_the_oracle_ranks_by_time_and_never_recommends_what_does_not_fit():
    machine = MachineModel.from_file(H100)
    verdicts = consult(
        "gpt_medium", "tokens", machine, nodes=[1, 2], global_batch=16, memory_per_device=int(5e9),
        strategies=["ddp", "fsdp", "zero2", "gpipe", "1f1b", "tensor"],
    )  # fmt: skip
    for verdict in verdicts:
        runnable = [c for c in verdict.ranked if c.prediction is not None and c.prediction.fits]
        times = [c.prediction.step_time_s for c in runnable]
        assert times == sorted(times)
        ddp = next(c for c in verdict.ranked if c.setting.strategy == "ddp")
        assert (
            ddp.prediction is not None and ddp.prediction.fits is False
        )  # 355M parameters × 4 copies × 4 B + activations > 5 GB
        assert verdict.recommended is not None and verdict.recommended.prediction.fits
        assert verdict.recommended.setting.strategy in verdict.reason


def test_accuracy_is_one_minus_the_relative_error_averaged_per_strategy_then_over_strategies():
    table = pd.DataFrame(
        {
            "point_id": ["a", "b", "c", "d"],
            "status": ["ok", "ok", "ok", "failed"],
            "strategy": ["ddp", "ddp", "gpipe", "gpipe"],
            "model": "m", "dataset": "d", "nodes": 1, "ranks_per_node": 2, "global_batch_size": 64, "precision": "fp32",
            "step_time_s_median": [1.0, 2.0, 4.0, None],
            "tensor_peak_bytes": [100, 100, 200, None],
        }
    )  # fmt: skip
    predictions = pd.DataFrame(
        {
            "point_id": ["a", "b", "c", "d"],
            "step_time_s": [1.1, 1.0, 3.0, 1.0],
            "peak_memory_bytes": [90, 100, 200, 1],
            "samples_per_s": 1.0,
        }
    )
    joined = join(table, predictions)
    assert list(joined["point_id"]) == ["a", "b", "c"]  # a failed point has nothing to compare
    assert list(joined["time_accuracy"]) == pytest.approx([0.9, 0.5, 0.75])
    rows = {r.strategy: r for r in by_strategy(joined)}
    assert rows["ddp"].time_accuracy == pytest.approx(0.7) and rows["ddp"].time_worst == pytest.approx(0.5)
    assert rows["ddp"].memory_accuracy == pytest.approx(0.95)
    assert overall(rows.values()) == pytest.approx(((0.7 + 0.75) / 2, (0.95 + 1.0) / 2))
    assert accuracy(3.0, 1.0) == pytest.approx(-1.0)  # kept below zero, not clipped


def _configurations(predicted: dict[str, float], spread: float, seed: int, launches: int = 3) -> pd.DataFrame:
    """`launches` launches of each of the strategies' configurations, each launch's step time its strategy's true
    time 1.0 s times a lognormal factor of sd `spread`; `predicted` the model's time per strategy."""
    import random

    rng = random.Random(seed)
    rows, predictions = [], []
    for strategy, guess in predicted.items():
        for config in range(4):
            for repetition in range(launches):
                point = f"{strategy}-{config}-{repetition}"
                rows.append(
                    {"point_id": point, "config_key": f"{strategy}-{config}", "status": "ok", "strategy": strategy,
                     "model": "m", "step_time_s_median": math.exp(rng.gauss(0.0, spread)), "tensor_peak_bytes": 1}
                )  # fmt: skip
                predictions.append({"point_id": point, "step_time_s": guess, "peak_memory_bytes": 1})
    return per_configuration(join(pd.DataFrame(rows), pd.DataFrame(predictions)))


def test_the_time_accuracys_interval_comes_from_launches_and_judges_the_target_only_where_they_agree():
    # one launch a configuration: no interval at all (resampling one launch would claim certainty)
    assert time_accuracy_interval(_configurations({"ddp": 1.0}, spread=0.3, seed=0, launches=1)) is None
    # no launch-to-launch spread: nothing to resample, the interval is the figure itself
    exact = time_accuracy_interval(_configurations({"ddp": 1.0, "gpipe": 0.8}, spread=0.0, seed=0))
    assert exact.value == pytest.approx((1.0 + 0.8) / 2) and exact.low == exact.high == pytest.approx(exact.value)
    assert exact.against(0.85) == "met" and exact.against(0.95) == "missed"
    # a model 1.5x too slow on every configuration: missed whatever the noise of 5 % per launch
    slow = time_accuracy_interval(_configurations({"ddp": 1.5, "gpipe": 1.5}, spread=0.05, seed=1))
    assert slow.high < 0.9 and slow.against(0.90) == "missed"
    # the truth predicted, launches noisy (sd 30 %): the figure falls below 90 % by the noise alone, and the
    # interval reaches above the target: the launches cannot tell a perfect model from one that misses
    noisy = time_accuracy_interval(_configurations({"ddp": 1.0, "gpipe": 1.0}, spread=0.30, seed=2))
    assert noisy.low < noisy.value < noisy.high and noisy.high - noisy.low > 0.05
    assert noisy.against(0.90) in ("undecided", "missed") and noisy.against(noisy.low) == "met"
    # more noise, wider: the interval says how sure the figure is
    quiet = time_accuracy_interval(_configurations({"ddp": 1.0, "gpipe": 1.0}, spread=0.05, seed=2))
    assert quiet.high - quiet.low < noisy.high - noisy.low
    assert time_accuracy_interval(_configurations({"ddp": 1.0}, spread=0.3, seed=3), seed=5) == (
        time_accuracy_interval(_configurations({"ddp": 1.0}, spread=0.3, seed=3), seed=5)
    )  # reproducible: a fixed seed


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ddlbench", *args], capture_output=True, text=True, cwd=REPO, timeout=300
    )


@pytest.mark.slow  # starts the CLI as a process
def test_predict_writes_the_csv_a_tool_reads(tmp_path):
    out = tmp_path / "p.csv"
    done = _cli("predict", "--machine", str(H100), "--format", "csv", "--out", str(out))
    assert done.returncode == 0, done.stderr
    frame = pd.read_csv(out)
    assert {"point_id", "step_time_s", "samples_per_s", "peak_memory_bytes"} <= set(frame.columns)
    assert list(frame.columns) == list(CSV_COLUMNS)
    assert (frame["step_time_s"] > 0).all()
    bad = _cli("predict", "--machine", str(H100), "--point", "nonsense")
    assert bad.returncode != 0 and "nonsense" in bad.stderr and "resnet8" in bad.stderr


@pytest.mark.slow  # starts the CLI as a process
def test_the_oracle_cli_names_a_recommendation_and_refuses_unknown_models(tmp_path):
    done = _cli(
        "oracle",
        "--model",
        "resnet20",
        "--dataset",
        "cifar10",
        "--machine",
        str(H100),
        "--nodes",
        "1,2",
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [v["nodes"] for v in data["verdicts"]] == [1, 2]
    assert all(v["recommended"] for v in data["verdicts"])
    bad = _cli("oracle", "--model", "resnet21", "--dataset", "cifar10", "--machine", str(H100))
    assert bad.returncode != 0 and "resnet21" in bad.stderr and "resnet20" in bad.stderr


def test_a_setting_of_a_point_carries_its_layout(tmp_path):
    from ddlbench.config import sweep_config_from_mapping
    from ddlbench.sweep import expand_sweep

    config = sweep_config_from_mapping(
        {
            "name": "s",
            "models": ["resnet8"],
            "datasets": ["cifar10"],
            "strategies": ["gpipe"],
            "nodes": [1],
            "ranks_per_node": [2],
            "batch_size": [32],
            "micro_batches": [4],
            "threads": [1],
        }
    )
    (point,) = expand_sweep(config).points
    s = Setting.of_point(point)
    assert (s.split, s.micro_batches, s.world_size, s.point_id) == (2, 4, 2, point.point_id)
    assert replace(s, batch_size=64).global_batch_size == 64


def test_mobilenet_v2s_residual_sums_are_priced_where_its_blocks_add_them():
    """Each inverted residual that keeps its shape adds its input to its output: the model table shows that
    sum (a `shortcut` child, as ResNet's blocks hold) and the compute prices it, one per such block of the
    model as built."""
    import torch

    from ddlbench.analysis.analytic.compute import block_times, residual_sums
    from ddlbench.catalog import DATASETS, MODELS, resolve_builder
    from ddlbench.train.models.mobilenet import InvertedResidual

    table = introspected_table("mobilenet_v2", "cifar10", (("norm", "batch"),))
    spec, data = MODELS.get("mobilenet_v2"), DATASETS.get("cifar10")
    with torch.device("meta"):
        model = resolve_builder(spec.builder)(sample_shape=data.sample_shape, num_outputs=data.num_outputs)
    adding = [
        module for module in model.modules() if isinstance(module, InvertedResidual) and module.shortcut is not None
    ]
    assert len(adding) >= 5 and len(residual_sums(table.layers)) == len(adding)
    priced = block_times(table, cpu_machine(), batch=8, precision="fp32", threads=1, sharing=1)
    rows = [row for row in table.layers if row.type != "Identity"]
    without = block_times(replace(table, layers=tuple(rows)), cpu_machine(), batch=8, precision="fp32", threads=1)
    assert sum(priced.forward_s) > sum(without.forward_s)
