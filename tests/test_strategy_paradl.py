"""ParaDL filter and channel parallelism and the df hybrid, against one process training the whole model.

Every rank of a filter/channel group is fed the same batch and computes the same loss, so the split
run must reproduce the single-process run up to float32 summation order. Where the two differ:
filter parallelism sums each split layer's input gradient as two half-sums (one per rank's filters,
added by the all-reduce) where the reference's convolution backward sums over all filters at once;
channel parallelism sums each output as two half-sums over input channels. Each reordering moves a
value by about one float32 ulp; the parameters must end within the rounding bound of
tests/equivalence.py (measured: at most 1/100 of it where training is smooth, on AVX2 and scalar
kernels), which sits far below what a wrong backward does (the broken variants at the end land
thousands of bounds away). Where a ReLU input sits within a rounding of its gate (tests/chaos.py finds
those fixtures: BatchNorm over the whole batch, resnet18, cosmoflow, mobilenet_v2), one CPU's rounding
flips it and another's does not: those are compared in float64 (tests/float64.py).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ddlbench.train.kernel import build_model, step_batches, strategy_setup
from ddlbench.train.strategies import RankContext, build_trainer
from ddlbench.train.strategies import collectives as C
from ddlbench.train.strategies.common import cpu_state
from ddlbench.train.strategies.paradl import plan_split
from tests.equivalence import (
    assert_beyond_rounding,
    assert_within_rounding,
    check_against_reference,
    layout_point,
    parameter_names,
    rounding_bound,
)
from tests.float64 import check_against_reference_float64, checked_facts
from tests.reference import as_dtype, build_model_as, train_reference

GROUP = (("norm", "group"),)
BATCH = (("norm", "batch"),)


def test_plan_splits_what_divides_and_names_the_rest():
    model = build_model(layout_point(strategy="filter", nodes=1, ranks_per_node=2, model_options=GROUP))
    filters = plan_split(model, 2, "filter")
    # resnet8: the stem, 2 convolutions in each of 3 blocks, 2 shortcut projections, the classifier;
    # all have an even number of outputs (16·2^k filters, 10 classes)
    assert len(filters) == 1 + 2 * 3 + 2 + 1
    assert all(reason is None for reason in filters.values())
    channel = plan_split(model, 2, "channel")
    # the stem sees 3 input channels, which 2 ranks cannot share; every later layer has 16·2^k
    assert {name for name, reason in channel.items() if reason} == {"0.0"}
    assert "in_channels=3" in channel["0.0"]
    # the classifier's 10 outputs do not split 4 ways; its 64 inputs do
    assert plan_split(model, 4, "filter")["4.2"] == "out_features=10 does not divide by 4"
    assert plan_split(model, 4, "channel")["4.2"] is None
    depthwise = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, groups=8))
    assert plan_split(depthwise, 2, "filter") == {"0": "grouped convolution (groups=8)"}


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.parametrize(
    ("strategy", "norm", "threads", "in_float64", "real_run"),
    [
        pytest.param("filter", GROUP, 1, False, False, id="filter-group", marks=pytest.mark.equivalence_sse),
        # channel parallelism sums a sample's forward in two halves: in float64, as it is on the edge of
        # chaos in float32 (tests/chaos.py's perturbed references 0.03 bounds away on AVX2 kernels, up to 42
        # on scalar ones); the real run checks its record and first loss
        pytest.param("channel", GROUP, 1, True, True, id="channel-group"),
        # BatchNorm sits on replicated activations of the full batch on every rank, so it normalises
        # exactly what the single process does: no shards needed, unlike data parallelism. Chaotic in
        # float32: the filter and 2-thread channel runs ended 0.64 bounds away on AVX2 kernels (1/500 on
        # scalar ones), tests/chaos.py's perturbed references 0.64 (filter) and 47 (channel) bounds away
        pytest.param("filter", BATCH, 1, True, False, id="filter-batch"),
        pytest.param("channel", BATCH, 1, True, False, id="channel-batch"),
        # two intra-op threads on each rank and in the reference: other groupings of the half-sums
        pytest.param("channel", BATCH, 2, True, False, id="channel-batch-threads2"),
    ],
)
def test_two_rank_split_matches_single_process(tmp_path, strategy, norm, threads, in_float64, real_run):
    checked = checked_facts(
        tmp_path,
        in_float64=in_float64,
        real_run=real_run,
        strategy=strategy,
        nodes=1,
        ranks_per_node=2,
        batch_size=8,
        threads=threads,
        model_options=norm,
    )
    dim = "fp" if strategy == "filter" else "cp"
    point = layout_point(strategy=strategy, ranks_per_node=2, batch_size=8, threads=threads, model_options=norm)
    sizes = ([8, 4] if in_float64 else [4])[: len(checked)]  # bytes per element: the float64 run, the real run
    for facts, element_bytes in zip(checked, sizes, strict=True):
        assert [f["coords"] for f in facts] == [{dim: 0}, {dim: 1}]
        assert all(f["mesh"] == {dim: 2} for f in facts)
        first = facts[0]
        assert first["split_layers"] == (10 if strategy == "filter" else 9)
        assert first["replicated_layers"] == (0 if strategy == "filter" else 1)
        assert first["full_parameters"] == sum(p.numel() for p in build_model(point).parameters())
        # each rank holds half of every split weight plus all of what stays replicated
        assert first["local_parameters"] == first["sharded_parameters"] + first["replicated_parameters"]
        assert first["full_parameters"] == 2 * first["sharded_parameters"] + first["replicated_parameters"]
        assert first["sharded_weight_bytes"] == element_bytes * first["sharded_parameters"]


@pytest.mark.slow
@pytest.mark.equivalence
def test_df_hybrid_on_four_ranks_matches_single_process(tmp_path):
    record = check_against_reference(
        tmp_path,
        shards=2,  # each replica's batch of 8 apart in the reference too: batch-size-proof (tests/test_ddp.py)
        strategy="dp_filter",
        nodes=1,
        ranks_per_node=4,
        split=2,
        batch_size=8,
        model_options=GROUP,
    )
    assert record.metrics.global_batch_size == 16  # two replicas of batch 8
    assert [rank.facts["coords"] for rank in record.ranks] == [
        {"dp": 0, "fp": 0},
        {"dp": 0, "fp": 1},
        {"dp": 1, "fp": 0},
        {"dp": 1, "fp": 1},
    ]
    assert all(rank.facts["mesh"] == {"dp": 2, "fp": 2} for rank in record.ranks)


# At batch 2 and the default lr 0.05 the zoo models diverge (resnet18: loss 2.6 → 20 in one step,
# mobilenet_v2 2.5 → 11), which magnifies rounding in both runs alike; at lr 0.005 they still move by
# > 1e-3. vgg11 under filter parallelism stays within 1/100 of the float32 rounding bound (tests/chaos.py's
# perturbed references: 0.04); resnet18 and cosmoflow under channel parallelism are chaotic in float32
# (perturbed references 61 and 9 bounds away: a ReLU input within a rounding of zero flips under the
# regrouped sums) and are compared in float64.
ZOO = dict(nodes=1, ranks_per_node=2, batch_size=2, warmup_steps=1, steps=1, learning_rate=0.005)


def _zoo(strategy: str, model: str, module: str, why: str, *, in_float64: bool = False, **fields) -> object:
    """A larger model's case of the zoo (models/<module>.py)."""
    return pytest.param(strategy, model, fields, in_float64, id=f"{strategy}-{model}-{why}")


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.parametrize(
    ("strategy", "model", "fields", "in_float64"),
    [
        _zoo("filter", "vgg11", "vgg", "linear_head"),  # the two 512-wide classifier layers are split too
        # stride-2 3×3 and 1×1 projections, 64–512 channels
        _zoo("channel", "resnet18", "resnet", "stride2", in_float64=True),
        # Conv3d with biases (norm none): channel parallelism adds each bias once, after the sum
        _zoo("channel", "cosmoflow", "cosmoflow", "conv3d_bias", in_float64=True, dataset="cosmoflow32", norm="none"),
    ],
)
def test_zoo_models_match_single_process(tmp_path, strategy, model, fields, in_float64):
    fields = dict(fields)
    norm = fields.pop("norm", "group")
    fields |= dict(strategy=strategy, model=model, model_options=(("norm", norm),), **ZOO)
    checked_facts(tmp_path, in_float64=in_float64, **fields)


# MobileNetV2 at batch 2 is chaotic in float32 even at lr 0.005: the reference against itself with its
# initial weights scaled by 1 + 1e-7·noise ends 14 % of the training's movement apart after two steps,
# and filter parallelism's regrouped sums landed 2.4 float32 bounds away on an AMD EPYC (one depthwise
# weight 1.3e-5 off) where another CPU had measured 2e-7. In float64 the same run ends within 1/70 of
# the float64 bound (on one thread per rank or two: measured 0.014 of it both ways).
@pytest.mark.slow
@pytest.mark.equivalence
def test_mobilenet_v2_depthwise_matches_single_process_in_float64(tmp_path):
    # depthwise (grouped) convolutions stay replicated between the split 1×1 convolutions
    model = build_model(layout_point(strategy="filter", model="mobilenet_v2", ranks_per_node=2, model_options=GROUP))
    replicated = [reason for reason in plan_split(model, 2, "filter").values() if reason]
    assert replicated and all(reason.startswith("grouped convolution") for reason in replicated)
    fields = dict(strategy="filter", model="mobilenet_v2", model_options=GROUP, **ZOO)
    got = check_against_reference_float64(tmp_path, **fields).run.state
    # sensitivity: the float64 bound is tight enough to fail a reference whose learning rate is 1e-4 off
    point = layout_point(**fields)
    off = layout_point(**fields | {"learning_rate": point.learning_rate * (1 + 1e-4)})
    wrong, _ = train_reference(off, dtype=torch.float64)
    model = build_model_as(point, torch.float64)
    names = parameter_names(model)
    assert_beyond_rounding(got, {n: wrong[n] for n in names}, model.state_dict(), rounding_bound(point, model))


# --- in-process ranks (forked), to look inside one step and to break a collective on purpose ---


def _break(breakage: str | None) -> None:
    """Swap one collective for a wrong one, in this (forked) process only."""
    if breakage == "no_input_grad_sum":  # filter: each rank keeps its partial input gradient
        C.copy_to_group = lambda x, group=None: x
    elif breakage == "summed_output_grad":
        # channel: the partial outputs' gradient summed over ranks in backward (p times too large), what
        # torch.distributed.nn.functional.all_reduce does; built from the module's own pieces
        C.reduce_from_group = lambda x, group=None: C.copy_to_group(C._ReduceFromGroup.apply(x, group), group)


def _rank_main(rank: int, world: int, store: Path, out: Path, point, breakage: str | None) -> None:
    """One forked rank: the point's training steps in float64, then its full and local state to `out`."""
    code = 0
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        _break(breakage)
        ctx = RankContext(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"), backend="gloo")
        setup = strategy_setup(point, ctx)
        setup = dataclasses.replace(setup, sample=as_dtype(setup.sample, torch.float64))
        trainer = build_trainer(point.strategy, build_model_as(point, torch.float64), setup)
        start, stop = trainer.local_batch_range(point.global_batch_size)
        for inputs, targets in step_batches(point, start, stop, ctx.device)[: point.warmup_steps + point.steps]:
            trainer.step(as_dtype(inputs, torch.float64), targets)
        sharded = {name for name, _, _ in trainer._sharded()}
        full = trainer.full_state_dict()
        torch.save({"full": full, "local": cpu_state(trainer.model), "sharded": sharded}, out / f"rank{rank}.pt")
    except Exception:
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        code = 1
    finally:
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
        os._exit(code)  # gloo can abort in its destructors at a normal exit


def _run_forked(tmp_path: Path, point, breakage: str | None = None) -> list[dict]:
    """Fork the point's ranks from this process (0.1 s instead of a launch); each rank's saved states."""
    fork = multiprocessing.get_context("fork")
    out = tmp_path / (breakage or "intact")
    out.mkdir()
    procs = [
        fork.Process(target=_rank_main, args=(r, point.world_size, out / "store", out, point, breakage))
        for r in range(point.world_size)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    errors = [path.read_text() for path in sorted(out.glob("*.err"))]
    assert not errors, errors[0]
    assert [proc.exitcode for proc in procs] == [0] * len(procs)
    return [torch.load(out / f"rank{r}.pt") for r in range(point.world_size)]


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.equivalence_sse
@pytest.mark.parametrize(("strategy", "breakage"), [("filter", "no_input_grad_sum"), ("channel", "summed_output_grad")])
def test_replicas_stay_identical_and_a_wrong_backward_is_caught(tmp_path, strategy, breakage):
    # in float64, as channel parallelism regroups a sample's forward (see test_two_rank_split_matches_...)
    point = layout_point(
        strategy=strategy, nodes=1, ranks_per_node=2, batch_size=8, warmup_steps=1, steps=1, model_options=GROUP
    )
    want, _ = train_reference(point, dtype=torch.float64)
    model = build_model_as(point, torch.float64)
    names, initial, bound = parameter_names(model), model.state_dict(), rounding_bound(point, model)
    intact = _run_forked(tmp_path, point)
    assert intact[1]["full"] is None
    assert_within_rounding(intact[0]["full"], {n: want[n] for n in names}, initial, bound, label="forked")
    # replicated parameters and buffers end bitwise equal on both ranks with no reduction of their
    # own: every collective hands the same values and gradients to every rank
    replicated = set(intact[0]["local"]) - intact[0]["sharded"]
    assert replicated and all(torch.equal(intact[0]["local"][n], intact[1]["local"][n]) for n in replicated)
    # while the sharded ones really are different slices
    assert all(not torch.equal(intact[0]["local"][n], intact[1]["local"][n]) for n in intact[0]["sharded"])

    broken = _run_forked(tmp_path, point, breakage)
    assert_beyond_rounding(broken[0]["full"], {n: want[n] for n in names}, initial, bound)
