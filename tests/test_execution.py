"""Execution options (ddlbench.train.execution): precision, channels_last and compile really take effect,
are refused with a reason where they cannot, and are recorded as they ran."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn

from ddlbench.analysis.aggregate import build_table
from ddlbench.catalog import DATASETS, STRATEGIES
from ddlbench.errors import DdlbenchError
from ddlbench.launch.runner import run_point
from ddlbench.point import PRECISIONS
from ddlbench.records import RankResult
from ddlbench.report.render import render_report
from ddlbench.train.execution import (
    Execution,
    configure_execution,
    first_conv_memory_format,
    restored_execution_flags,
)
from ddlbench.train.kernel import MOMENTUM, build_model, step_batches
from ddlbench.train.losses import loss_for
from ddlbench.validity import why_skipped
from tests.conftest import make_point
from tests.equivalence import SAFETY, assert_within_rounding, check_against_reference, layout_point, rounding_bound
from tests.report_data import tables
from tests.test_aggregate import plan_of, record_for, write

CPU = torch.device("cpu")
# unit roundoff of each dtype's significand: 2^-(mantissa bits + 1)
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def autocast_loss_bound(model: nn.Module, logits: Tensor, unit_roundoff: float) -> float:
    """How far rounding to a dtype of unit roundoff u can move a forward pass's cross-entropy loss.

    Autocast rounds each convolution's and linear layer's input and weight to the low dtype and its
    output too (the products are accumulated in float32): three roundings of relative size <= u per
    layer, so over the L such layers of the model the logits move by at most about 3·L·u of their largest
    magnitude. Cross-entropy's gradient in the logits is softmax - one-hot, whose l1 norm is <= 2, so the
    loss moves by at most 2·‖Δlogits‖∞ <= 2·3·L·u·max|logit|. The same formula with float32's u bounds
    what float32 rounding alone can do; bf16's u is 2^16 times larger.
    """
    layers = sum(isinstance(m, nn.Linear | nn.modules.conv._ConvNd) for m in model.modules())
    return 2 * 3 * layers * unit_roundoff * logits.detach().float().abs().max().item()


def one_step(model: nn.Module, execution: Execution, inputs: Tensor, targets: Tensor, *, hook=None):
    """One training step of `model` as a strategy runs it; returns the loss and the optimizer."""
    loss_fn = loss_for(DATASETS.get("cifar10").task)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=MOMENTUM)
    handle = hook and next(m for m in model.modules() if isinstance(m, nn.Conv2d)).register_forward_hook(hook)
    with execution.autocast():
        logits = model(execution.prepare_inputs(inputs))
        loss = loss_fn(logits, targets)
    if handle:
        handle.remove()
    execution.backward(loss)
    execution.optimizer_step(optimizer)
    return loss.detach(), logits.detach(), optimizer


@pytest.fixture
def batch():
    point = make_point()
    return step_batches(point, 0, point.global_batch_size, CPU)[0]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_computes_in_the_low_dtype_and_keeps_weights_and_optimizer_state_fp32(batch, precision):
    inputs, targets = batch
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    seen: list[torch.dtype] = []
    with restored_execution_flags():
        execution = configure_execution(precision, False, False, CPU)  # torch 2.13 CPU autocast runs both
    model = build_model(make_point())
    loss, logits, optimizer = one_step(model, execution, inputs, targets, hook=lambda m, a, out: seen.append(out.dtype))
    assert seen == [low], "the first convolution did not compute in the autocast dtype"
    assert logits.dtype == low and loss.dtype == torch.float32  # cross-entropy runs in float32 under autocast
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters()} == {torch.float32}
    assert {s["momentum_buffer"].dtype for s in optimizer.state.values()} == {torch.float32}

    reference = build_model(make_point())
    want, want_logits, _ = one_step(reference, Execution(), inputs, targets)
    error = abs(loss.item() - want.item())
    assert error <= autocast_loss_bound(reference, want_logits, UNIT_ROUNDOFF[low])
    if precision == "bf16":  # fp16 keeps 3 more bits: its error may sit near float32's bound times SAFETY
        assert error > SAFETY * autocast_loss_bound(reference, want_logits, UNIT_ROUNDOFF[torch.float32]), (
            "the bf16 loss is as close to float32's as float32 rounding alone would put it"
        )
    facts = execution.facts(model)
    assert facts["autocast_dtype"] == str(low).removeprefix("torch.") and facts["optimizer_steps"] == 1


def test_fp16_scaler_scales_skips_an_overflowing_step_on_the_spot_and_backs_off(batch):
    inputs, targets = batch
    with restored_execution_flags():
        execution = configure_execution("fp16", False, False, CPU)
    assert execution.scaler is not None and execution.scaler.get_scale() == 2.0**16  # torch's initial scale
    model = build_model(make_point())
    _, _, optimizer = one_step(model, execution, inputs, targets)
    assert execution.skipped_steps == 0 and execution.scaler.get_scale() == 2.0**16  # grows after 2000 clean steps
    # gradients were unscaled before the step: the update is lr·grad of the unscaled loss, never 65536× that
    first = next(model.parameters())
    assert first.grad.abs().max().item() < 1e3

    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    handle = first.register_hook(lambda grad: grad * math.inf)
    loss_fn = loss_for(DATASETS.get("cifar10").task)
    optimizer.zero_grad(set_to_none=True)
    with execution.autocast():
        loss = loss_fn(model(inputs), targets)
    execution.backward(loss)
    execution.optimizer_step(optimizer)
    handle.remove()
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters()), "an inf step was applied"
    assert execution.skipped_steps == 1 and execution.scaler.get_scale() == 2.0**15
    facts = execution.facts(model)["grad_scaler"]
    assert facts == {"final_scale": 2.0**15, "skipped_steps": 1, "agrees_over": "rank"}


def test_tf32_on_a_cpu_is_refused_naming_the_value_and_the_reason():
    with restored_execution_flags(), pytest.raises(DdlbenchError) as caught:
        configure_execution("tf32", False, False, CPU)
    message = str(caught.value)
    assert "'tf32'" in message and "compute capability >= 8.0" in message and "cpu" in message
    assert "accepted here: fp32, bf16, fp16" in message


def test_an_unknown_precision_names_the_accepted_ones():
    with pytest.raises(DdlbenchError, match=r"precision 'fp8' unknown; accepted: fp32, tf32, bf16, fp16"):
        Execution(precision="fp8")


def test_fp32_switches_tf32_off_and_reads_the_switches_back():
    with restored_execution_flags():
        torch.backends.cudnn.allow_tf32 = True  # cuDNN's default: fp32 must turn it off itself
        torch.set_float32_matmul_precision("high")
        execution = configure_execution("fp32", False, False, torch.device("cpu"))
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        assert execution.facts()["float32_matmul_precision"] == "highest"


def test_channels_last_weights_are_nhwc_and_the_step_matches_the_contiguous_one(batch):
    inputs, targets = batch
    point = make_point(channels_last=True)
    execution = Execution(channels_last=True)
    model = execution.prepare_model(build_model(point))
    convs = [m.weight for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert first_conv_memory_format(model) == "channels_last"
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    assert execution.prepare_inputs(inputs).is_contiguous(memory_format=torch.channels_last)
    got_loss, _, _ = one_step(model, execution, inputs, targets)
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in convs), "the step lost the layout"

    reference = build_model(point)
    initial = {name: value.clone() for name, value in reference.state_dict().items()}
    want_loss, _, _ = one_step(reference, Execution(), inputs, targets)
    assert first_conv_memory_format(reference) == "contiguous"
    # the same float32 arithmetic, other loop orders: within the rounding bound of one step
    bound = replace(rounding_bound(point, reference), steps=1)
    got = {name: value.contiguous() for name, value in model.state_dict().items()}
    assert_within_rounding(got, reference.state_dict(), initial, bound, label="channels_last")
    assert abs(got_loss.item() - want_loss.item()) <= bound.loss_tolerance(want_loss.item())


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"strategy": "horovod", "precision": "fp16"}, ["horovod", "precision=fp16", "fp32, tf32, bf16"]),
        ({"strategy": "gpipe", "nodes": 2, "compile": True}, ["gpipe", "compile=true", "ddp"]),
        ({"strategy": "fsdp", "nodes": 2, "compile": True}, ["fsdp", "compile=true", "zero2"]),
        ({"strategy": "filter", "nodes": 2, "compile": True}, ["filter", "compile=true"]),
        ({"strategy": "fsdp", "nodes": 2, "channels_last": True}, ["fsdp", "channels_last=true", "set it to false"]),
        ({"strategy": "zero2", "nodes": 2, "channels_last": True}, ["zero2", "channels_last=true"]),
        ({"model": "gpt_tiny", "dataset": "tokens_small", "channels_last": True}, ["channels_last", "gpt_tiny"]),
    ],
)
def test_the_plan_skips_what_a_strategy_cannot_honour_with_a_reason(fields, names):
    reason = why_skipped(layout_point(**fields))
    assert reason is not None and all(name in reason for name in names), reason


def test_every_strategy_runs_every_precision_it_does_not_refuse_and_refusals_are_sentences():
    for name in STRATEGIES.names():
        refuses = STRATEGIES.get(name).refuses
        assert set(refuses) <= {f"precision={p}" for p in PRECISIONS} | {"channels_last", "compile"}, name
        assert all(why and "\n" not in why for why in refuses.values())
    # what this module runs without a plan-time refusal, on the CPU
    assert why_skipped(layout_point(strategy="ddp", precision="fp16", channels_last=True, compile=True)) is None
    assert why_skipped(layout_point(strategy="gpipe", nodes=2, micro_batches=2, precision="fp16")) is None


def test_old_rank_records_read_with_an_empty_execution():
    old = {"rank": 0, "hostname": "h", "step_times_s": [0.1], "losses": [1.0], "peak_rss_bytes": 1}
    assert RankResult.from_dict(old).execution == {}


def test_the_table_and_report_show_precision_channels_last_and_compile_where_a_sweep_varies_them(tmp_path):
    plan = plan_of(tmp_path, strategies=["ddp"], nodes=[1], precision=["fp32", "bf16"], channels_last=[False, True])
    write(plan, [record_for(point) for point in plan.points])
    table = build_table(plan)
    assert {"precision", "channels_last", "compile"} <= set(table.columns)
    assert sorted(set(table["precision"])) == ["bf16", "fp32"] and set(table["channels_last"]) == {False, True}
    points = tables(render_report(plan.config, table))["points"]
    assert points["_titles"]["precision"] == "Precision" and points["_titles"]["channels_last"] == "Channels last"
    assert sorted(set(points["precision"])) == ["bf16", "fp32"] and set(points["channels_last"]) == {"True", "False"}


def _overflow_on_one_rank(rank: int, world: int, folder: str) -> None:
    """One plain and one DTensor parameter, gradients set to the scale (unscaled: 1); the second step's
    plain gradient overflows on the last rank only."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        plain = nn.Parameter(torch.ones(4))
        sharded = nn.Parameter(distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]))
        optimizer = torch.optim.SGD([plain, sharded], lr=0.5)
        with restored_execution_flags():
            execution = configure_execution("fp16", False, False, CPU)
        seen = []
        for overflow in (False, True):
            scale = execution.scaler.get_scale()
            plain.grad = torch.full((4,), scale)
            plain.grad[0] = math.inf if overflow and rank == world - 1 else scale
            sharded.grad = distribute_tensor(torch.full((4, 2), scale), mesh, [Shard(0)])
            execution.optimizer_step(optimizer)
            seen.append([plain[1].item(), sharded.to_local()[0, 0].item(), execution.scaler.get_scale()])
        facts = execution.facts()["grad_scaler"]
        Path(folder, f"{rank}.json").write_text(json.dumps({"seen": seen, "facts": facts}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_world_scaler_unscales_dtensor_and_plain_gradients_and_one_ranks_overflow_skips_every_rank(tmp_path):
    # tensor parallelism holds both kinds; torch's unscale refuses them in one call
    mp.spawn(_overflow_on_one_rank, args=(2, str(tmp_path)), nprocs=2)
    for rank in range(2):
        got = json.loads((tmp_path / f"{rank}.json").read_text())
        # step 1 applied, unscaled (1 - 0.5·1); step 2 skipped on both ranks and the scale halved
        assert got["seen"] == [[0.5, 0.5, 2.0**16], [0.5, 0.5, 2.0**15]], (rank, got)
        assert got["facts"] == {"final_scale": 2.0**15, "skipped_steps": 1, "agrees_over": "world"}


# --- real ranks (local launcher, gloo) ---


def _run(tmp_path, **fields):
    point = layout_point(**fields)
    assert why_skipped(point) is None, why_skipped(point)
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    failures = "; ".join(f"rank {f.rank}: {f.error_type}: {f.message}" for f in record.failures)
    return point, record, failures


@pytest.mark.slow
def test_a_tf32_point_on_cpu_fails_with_the_reason_in_its_record(tmp_path):
    _, record, failures = _run(tmp_path, precision="tf32")
    assert record.status == "failed"
    assert "precision 'tf32' needs a CUDA GPU" in f"{record.reason} {failures}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "precision", "extra"),
    [
        ("ddp", "bf16", {"channels_last": True}),
        ("model_parallel", "bf16", {}),  # activations cross the stage boundary in bf16
        ("gpipe", "fp16", {"micro_batches": 2}),  # the schedule's own backward of the scaled loss
        ("fsdp", "fp16", {}),  # the scaler over DTensor gradient shards
        ("filter", "bf16", {"model": "vgg11", "channels_last": True}),  # collectives on bf16 activations
        # the scaler over DTensor shards beside plain (unsplit) layers' gradients
        ("tensor", "fp16", {"model": "gpt_tiny", "dataset": "tokens_small", "model_options": ()}),
    ],
)
def test_mixed_precision_runs_on_two_ranks_and_its_record_says_what_ran(tmp_path, strategy, precision, extra):
    point, record, failures = _run(
        tmp_path, strategy=strategy, nodes=2, precision=precision, warmup_steps=2, steps=2, **extra
    )
    assert record.status == "ok", f"{record.reason} {failures}"
    low = {"bf16": "bfloat16", "fp16": "float16"}[precision]
    for rank in record.ranks:
        assert rank.execution["precision"] == precision and rank.execution["autocast_dtype"] == low
        assert rank.execution["optimizer_steps"] == point.warmup_steps + point.steps
        if point.channels_last:
            assert rank.execution["weight_memory_format"] == "channels_last"
    scalers = [rank.execution.get("grad_scaler") for rank in record.ranks]
    if precision == "fp16":  # one scaler state on every rank: overflow agreed over the world
        assert all(s and s["agrees_over"] == "world" for s in scalers) and len({str(s) for s in scalers}) == 1
    else:
        assert scalers == [None, None]
    assert all(math.isfinite(loss) for rank in record.ranks for loss in rank.losses)


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.skipif(
    os.environ.get("ATEN_CPU_CAPABILITY") == "default",
    reason="inductor emits at::vec code that its headers leave out under ATEN_CPU_CAPABILITY=default "
    "(torch 2.13: \"'at::vec' has not been declared\"): a compiled point cannot run on ATen's scalar kernels",
)
@pytest.mark.parametrize(("strategy", "nodes", "batch"), [("ddp", 1, 8), ("model_parallel", 2, 8), ("zero2", 2, 4)])
def test_a_compiled_point_trains_like_the_eager_reference_and_is_probed(tmp_path, strategy, nodes, batch):
    # inductor compiles in the first warm-up step (tens of seconds on one CPU core); the memory probe runs
    # on the second. Compiled kernels regroup sums like another BLAS would: within the rounding bound. Every
    # fixture runs a global batch of 8, which tests/chaos.py finds smooth under forward regrouping (0.03 of
    # the bound); zero2 at 2 × 8 samples is chaotic there (24 bounds), so its ranks take 4 each
    record = check_against_reference(
        tmp_path,
        strategy=strategy,
        nodes=nodes,
        batch_size=batch,
        compile=True,
        warmup_steps=2,
        steps=2,
        model_options=(("norm", "group"),),
        timeout_s=600.0,
    )
    for rank in record.ranks:
        assert rank.execution["compiled"], rank.execution
        assert rank.tensor_peak_bytes is not None, rank.memory_probe
        assert rank.warmup_times_s[0] > 5 * max(rank.step_times_s), "the first warm-up step did not compile"


# --- CUDA ---

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
def test_tf32_and_fp32_switch_cuda_tf32_on_and_off_where_the_gpu_has_it():
    device = torch.device("cuda", 0)
    with restored_execution_flags():
        strict = configure_execution("fp32", False, False, device).facts()
        assert strict["cuda_matmul_allow_tf32"] is False and strict["cudnn_allow_tf32"] is False
        if torch.cuda.get_device_capability(device) < (8, 0):
            with pytest.raises(DdlbenchError, match=r"compute capability >= 8\.0"):
                configure_execution("tf32", False, False, device)
            return
        facts = configure_execution("tf32", False, False, device).facts()
        assert facts["cuda_matmul_allow_tf32"] is True and facts["cudnn_allow_tf32"] is True
        # a TF32 matmul keeps 10 mantissa bits: it lands farther from float64 than float32's own rounding
        a, b = torch.randn(512, 512, device=device), torch.randn(512, 512, device=device)
        exact = a.double() @ b.double()
        tf32_error = ((a @ b).double() - exact).abs().max().item()
        torch.backends.cuda.matmul.allow_tf32 = False
        fp32_error = ((a @ b).double() - exact).abs().max().item()
        assert tf32_error > 8 * fp32_error


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_on_cuda_computes_in_the_low_dtype_and_fp16_scales(precision):
    device = torch.device("cuda", 0)
    if precision == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        with restored_execution_flags(), pytest.raises(DdlbenchError, match="bfloat16"):
            configure_execution("bf16", False, False, device)
        return
    point = make_point()
    inputs, targets = step_batches(point, 0, point.global_batch_size, device)[0]
    with restored_execution_flags():
        execution = configure_execution(precision, False, False, device)
        seen: list[torch.dtype] = []
        with torch.device(device):
            model = build_model(point)
        one_step(model, execution, inputs, targets, hook=lambda m, a, out: seen.append(out.dtype))
    assert seen == [AUTOCAST[precision]] and {p.dtype for p in model.parameters()} == {torch.float32}
    if precision == "fp16":
        assert execution.facts(model)["grad_scaler"]["final_scale"] == 2.0**16


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
