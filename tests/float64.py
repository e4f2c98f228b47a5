"""The equivalence check in float64, for points whose float32 training is chaotic.

Some small-batch trainings have a ReLU input or a normalisation within a few float32 roundings of a
flip: two correct runs that merely group a sum differently then end as far apart as a wrong one would,
and which way the last bit falls depends on the CPU. In float64 (u = 2^-53) no difference gets near
such a gate, and the runs agree within the float64 `RoundingBound`. The kernel trains in float32
only, so here the point's strategy runs outside it: fresh spawned ranks (gloo) build the trainer on a
float64 model and feed it the float32 samples converted (read through the point's loader where the
point reads real data, as the kernel does); the reference (tests/reference.py) does the same in one
process.

With `real_run`, the point also runs for real (the kernel in float32, the launcher, the record): it
must end ok, with the first loss within float32 rounding of the reference's. That loss is a forward
pass over the initial weights, a continuous function of its sums, so another kernel's rounding moves
it by rounding only: no gate decides it, whatever flips in later steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddlbench.point import Point
from ddlbench.records import PointRecord
from ddlbench.train.data.loader import open_point_loader, reads_through_loader
from ddlbench.train.kernel import build_model, step_batches, strategy_setup
from ddlbench.train.strategies import RankContext, build_trainer
from tests.equivalence import (
    assert_within_rounding,
    check_against_reference,
    layout_point,
    parameter_names,
    rounding_bound,
    run_for_real,
)
from tests.reference import as_dtype, build_model_as, train_reference


@dataclass(frozen=True, kw_only=True)
class Float64Run:
    """What the float64 ranks end with: each step's loss, the mean over the ranks that compute one (as a
    record's losses are), rank 0's full state dict, each rank's trainer facts (a record's `facts`)."""

    losses: list[float]
    state: dict[str, torch.Tensor]
    facts: list[dict[str, Any]]


@dataclass(frozen=True, kw_only=True)
class Float64Check:
    """A passed float64 check: the float64 run, and the real float32 run's record where one was asked for."""

    run: Float64Run
    record: PointRecord | None

    @property
    def facts(self) -> list[list[dict[str, Any]]]:
        """Each rank's trainer facts from the float64 run, and from the real run where there was one."""
        return [self.run.facts] + ([[rank.facts for rank in self.record.ranks]] if self.record else [])


def train_float64(point: Point, out: Path) -> Float64Run:
    """The point's strategy on real ranks (fresh spawned processes, gloo) in float64."""
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
        process.join(timeout=300)
    codes = [process.exitcode for process in processes]
    for process in processes:
        if process.exitcode is None:
            process.kill()
    assert codes == [0] * point.world_size, f"rank exit codes {codes}"
    ranks = [json.loads(_rank_path(out, rank).read_text()) for rank in range(point.world_size)]
    reporting = [rank["losses"] for rank in ranks if None not in rank["losses"]]  # a first stage computes none
    losses = [math.fsum(step) / len(step) for step in zip(*reporting, strict=True)]
    return Float64Run(losses=losses, state=torch.load(out), facts=[rank["facts"] for rank in ranks])


def _rank_path(out: Path | str, rank: int) -> Path:
    return Path(f"{out}.rank{rank}.json")


def _float64_rank(rank: int, point: Point, port: int, out: str) -> None:
    code = 1
    try:
        torch.set_num_threads(point.threads)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=point.world_size)
        ctx = RankContext(
            rank=rank, world_size=point.world_size, local_rank=rank, device=torch.device("cpu"), backend="gloo"
        )
        model = build_model_as(point, torch.float64)
        setup = strategy_setup(point, ctx)
        setup = dataclasses.replace(setup, sample=as_dtype(setup.sample, torch.float64))  # shape and cost probes
        trainer = build_trainer(point.strategy, model, setup)
        start, stop = trainer.local_batch_range(point.global_batch_size)
        steps = point.warmup_steps + point.steps
        if reads_through_loader(point):  # every step's own samples, through the point's loader and workers
            loader = open_point_loader(point, start=start, stop=stop, device=ctx.device)
            batches = [loader.next_batch() for _ in range(steps)]
            loader.close()
        else:
            batches = step_batches(point, start, stop, ctx.device)
        losses = []
        for x, y in (batches[s % len(batches)] for s in range(steps)):
            loss = trainer.step(as_dtype(x, torch.float64), y)
            losses.append(None if loss is None else loss.item())
        state = trainer.full_state_dict()
        _rank_path(out, rank).write_text(json.dumps({"losses": losses, "facts": trainer.facts()}))
        if rank == 0:
            torch.save(state, out)
        dist.barrier()
        dist.destroy_process_group()
        code = 0
    except Exception:
        traceback.print_exc()
    os._exit(code)  # gloo can abort at interpreter exit; the result is already written


def check_first_loss(record: PointRecord, point: Point, *, shards: int = 1) -> None:
    """The real run's first loss (its initial weights' forward over the first global batch) within one
    step's float32 rounding bound of the reference's; returns nothing, asserts."""
    _, want_losses = train_reference(point, shards=shards, steps=1)
    bound = dataclasses.replace(rounding_bound(point, build_model(point)), steps=1)
    got, want = record.metrics.loss_first, want_losses[0]
    assert abs(got - want) <= bound.loss_tolerance(want), f"loss_first {got} != {want} (float32, one step)"


def check_against_reference_float64(
    tmp_path: Path,
    *,
    shards: int = 1,
    min_change: float = 1e-3,
    real_run: bool = False,
    launcher: str = "local",
    **fields,
) -> Float64Check:
    """check_against_reference (tests/equivalence.py) with both sides in float64, for a chaotic point:
    the parameters within the float64 rounding bound, moved by more than `min_change`, and every step's
    loss within the bound of the reference's. With `real_run`, the point first runs for real
    (float32, `launcher`), which must end ok with the reference's first loss (see the module's note)."""
    point = layout_point(**fields)
    record = None
    if real_run:
        record = run_for_real(tmp_path / "real", point, launcher=launcher)
        check_first_loss(record, point, shards=shards)
    run = train_float64(point, tmp_path / "float64.pt")
    want, want_losses = train_reference(point, shards=shards, dtype=torch.float64)
    model = build_model_as(point, torch.float64)
    initial = model.state_dict()
    names = parameter_names(model)
    bound = rounding_bound(point, model)
    assert_within_rounding(run.state, {n: want[n] for n in names}, initial, bound, label=f"{point.point_id} float64")
    moved = max((want[name] - initial[name]).abs().max().item() for name in names)
    assert moved > min_change, "training did not move the parameters; the comparison would prove nothing"
    for step, (value, reference) in enumerate(zip(run.losses, want_losses, strict=True)):
        assert abs(value - reference) <= bound.loss_tolerance(reference), f"step {step}: loss {value} != {reference}"
    return Float64Check(run=run, record=record)


def checked_facts(tmp_path: Path, *, in_float64: bool, real_run: bool = False, **fields) -> list[list[dict[str, Any]]]:
    """Each rank's trainer facts after the point passed its equivalence check: in float32 on the real run
    (check_against_reference: [real run's]), or in float64 for a fixture that is chaotic in float32
    (tests/chaos.py: [float64 run's] and, with `real_run`, [float64 run's, real run's])."""
    if in_float64:
        return check_against_reference_float64(tmp_path, real_run=real_run, **fields).facts
    assert not real_run, "a float32 check always runs the point for real"
    return [[rank.facts for rank in check_against_reference(tmp_path, **fields).ranks]]
