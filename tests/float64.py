"""The equivalence check in float64, for points whose float32 training is chaotic.

Some small-batch trainings have a ReLU input or a normalisation within a few float32 roundings of a
flip: two correct runs that merely group a sum differently then end as far apart as a wrong one would,
and which way the last bit falls depends on the CPU. In float64 (u = 2^-53) no difference gets near
such a gate, and the runs agree within the float64 `RoundingBound`. The kernel trains in float32
only, so here the point's strategy runs outside it: fresh spawned ranks (gloo) build the trainer on a
float64 model and feed it the float32 samples converted; the reference (tests/reference.py) does the
same in one process.
"""

from __future__ import annotations

import os
import socket
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddlbench.point import Point
from ddlbench.train.kernel import step_batches, strategy_setup
from ddlbench.train.strategies import RankContext, build_trainer
from tests.equivalence import assert_within_rounding, layout_point, parameter_names, rounding_bound
from tests.reference import as_dtype, build_model_as, train_reference


def train_float64(point: Point, out: Path) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The point's strategy on real ranks (fresh spawned processes, gloo) in float64; rank 0's losses
    and full state dict."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    processes = [
        context.Process(target=_float64_rank, args=(rank, point, port, str(out))) for rank in range(point.world_size)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    codes = [process.exitcode for process in processes]
    for process in processes:
        if process.exitcode is None:
            process.kill()
    assert codes == [0] * point.world_size, f"rank exit codes {codes}"
    return torch.load(out)


def _float64_rank(rank: int, point: Point, port: int, out: str) -> None:
    code = 1
    try:
        torch.set_num_threads(point.threads)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=point.world_size)
        ctx = RankContext(
            rank=rank, world_size=point.world_size, local_rank=rank, device=torch.device("cpu"), backend="gloo"
        )
        model = build_model_as(point, torch.float64)
        trainer = build_trainer(point.strategy, model, strategy_setup(point, ctx))
        start, stop = trainer.local_batch_range(point.global_batch_size)
        batches = step_batches(point, start, stop, ctx.device)
        steps = point.warmup_steps + point.steps
        losses = []
        for x, y in (batches[s % len(batches)] for s in range(steps)):
            loss = trainer.step(as_dtype(x, torch.float64), y)
            losses.append(None if loss is None else loss.item())
        state = trainer.full_state_dict()
        if rank == 0:
            torch.save((losses, state), out)
        dist.barrier()
        dist.destroy_process_group()
        code = 0
    except Exception:
        traceback.print_exc()
    os._exit(code)  # gloo can abort at interpreter exit; the result is already written


def check_against_reference_float64(
    tmp_path: Path, *, shards: int = 1, min_change: float = 1e-3, **fields
) -> dict[str, torch.Tensor]:
    """check_against_reference (tests/equivalence.py) with both sides in float64, for a chaotic point:
    the parameters within the float64 rounding bound, moved by more than `min_change`, and every loss
    rank 0 computed within the bound of the reference's. Returns rank 0's final state dict."""
    point = layout_point(**fields)
    losses, got = train_float64(point, tmp_path / "float64.pt")
    want, want_losses = train_reference(point, shards=shards, dtype=torch.float64)
    model = build_model_as(point, torch.float64)
    initial = model.state_dict()
    names = parameter_names(model)
    bound = rounding_bound(point, model)
    assert_within_rounding(got, {n: want[n] for n in names}, initial, bound, label=f"{point.point_id} float64")
    moved = max((want[name] - initial[name]).abs().max().item() for name in names)
    assert moved > min_change, "training did not move the parameters; the comparison would prove nothing"
    for value, reference in zip(losses, want_losses, strict=True):
        if value is not None:  # a pipeline's first stage computes no loss
            assert abs(value - reference) <= bound.loss_tolerance(reference), f"loss {value} != {reference}"
    return got
