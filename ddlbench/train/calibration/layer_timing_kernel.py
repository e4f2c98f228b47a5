"""A model's training step timed block by block on one rank (imported by the worker only: it needs torch).

The model is built as a training point builds it (ddlbench.train.kernel: the catalog's builder, weights
from seed 0) and trained as ddlbench trains: SGD with momentum (kernel.MOMENTUM), the dataset's loss
(ddlbench.train.losses), the precision through ddlbench.train.execution (autocast around the forward
pass and the loss, a gradient scaler under fp16), on synthetic samples of the dataset (seed 0; token
models get int64 ids of its vocabulary). Every model is a flat nn.Sequential; its top-level children
are the "blocks".

Each batch size first takes `warmup` steps untimed; then a barrier (the ranks time together, as a point's
ranks share a node); then `iterations` rounds, each one timed step of every batch size in turn, the order
reversed every other round (4, 8, 16, 16, 8, 4, …). A spell of load on the host then falls on every batch
size alike: timed one batch size after the other, a slow spell during one of them tilted the per-block
fit α + β·batch and with it every ratio between micro-batch sizes (on one noisy host, calibrations timed
that way predicted 1f1b at 4 micro-batches between ×0.92 and ×1.22 gpipe's at 2; a CI host predicted ×1.31
and measured ×0.87). Each step is stamped (host perf_counter on the CPU, CUDA events on the stream on a
GPU, read after each step's synchronisation) at:
- the step's start and end; zero_grad; the optimizer step;
- each block's forward: a forward pre-hook and a forward hook;
- the loss function's forward, around its call;
- each block's backward: a full backward pre-hook (the gradient of its output has arrived) and a full
  backward hook (the gradient of its input is computed).
Per step, in seconds:
- forward_s[i] = block i's forward end − start;
- backward_s[i] = block i's backward end − start. Block 0's input (images, token ids) never requires a
  gradient, and torch then fires its full backward hook as soon as its output's gradient arrives
  (with a warning; checked on torch 2.13), and gives any full backward pre-hook on it the same
  warning. So block 0 has no full backward hooks: its start is a hook on its output's gradient (the
  same instant a pre-hook marks), and its end is backward()'s return, i.e. block 0's backward is the
  rest of backward after it started, weight gradients included;
- loss_s = the loss function's forward + its backward (backward() called → the last block's backward
  start), scaling included under fp16;
- update_s = zero_grad + the optimizer step (under fp16 with unscaling and the scaler's update);
- step_s = end − start; other_s = step_s − all of the above: the gaps between hooks, autocast's entry
  and exit, the hooks' own cost.
A precision the device cannot run is returned as an entry with the reason instead of times.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ddlbench.catalog import DATASETS, MODELS, resolve_builder
from ddlbench.errors import DdlbenchError
from ddlbench.train.calibration.point import CalibrationPoint
from ddlbench.train.data import open_dataset
from ddlbench.train.execution import configure_execution
from ddlbench.train.kernel import MOMENTUM
from ddlbench.train.losses import loss_for
from ddlbench.train.models.init import materialise

SEED = 0
LEARNING_RATE = 0.01  # any small rate: the steps are timed, not trained to an end


class Stamps:
    """Named instants of one step: host clock on the CPU, CUDA events on the device's stream."""

    def __init__(self, device: torch.device) -> None:
        self.on_cuda = device.type == "cuda"
        self.device = device
        self.marks: dict[str, Any] = {}

    def mark(self, name: str) -> None:
        if self.on_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[name] = event
        else:
            self.marks[name] = time.perf_counter()

    def seconds(self) -> dict[str, float]:
        """Each instant in seconds after the step's first; clears the marks."""
        marks, self.marks = self.marks, {}
        if self.on_cuda:
            torch.cuda.synchronize(self.device)
            first = next(iter(marks.values()))
            return {name: first.elapsed_time(event) / 1000.0 for name, event in marks.items()}  # ms → s
        first = next(iter(marks.values()))
        return {name: value - first for name, value in marks.items()}


def build_timed_model(point: CalibrationPoint, device: torch.device) -> nn.Sequential:
    """The point's model, as ddlbench.train.kernel.build_model builds a training point's."""
    model_spec, dataset_spec = MODELS.get(point.model), DATASETS.get(point.dataset)
    torch.manual_seed(SEED)
    with torch.device("meta"):
        model = resolve_builder(model_spec.builder)(
            sample_shape=dataset_spec.sample_shape,
            num_outputs=dataset_spec.num_outputs,
            **dict(point.model_options),
            **dict(model_spec.shape),
        )
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"{point.model} is built as {type(model).__name__}; layer timings need a flat nn.Sequential")
    return materialise(model, device)


def attach_hooks(model: nn.Sequential, stamps: Stamps) -> list[Any]:
    """Forward and backward hooks on every block that stamp its start and end; returns their handles."""
    handles = []
    for index, block in enumerate(model.children()):
        handles.append(block.register_forward_pre_hook(_stamper(stamps, f"f{index}s")))
        if index == 0:  # no full backward hooks: see the module docstring
            handles.append(block.register_forward_hook(_first_block_hook(stamps)))
            continue
        handles.append(block.register_forward_hook(_stamper(stamps, f"f{index}e")))
        handles.append(block.register_full_backward_pre_hook(_stamper(stamps, f"b{index}s")))
        handles.append(block.register_full_backward_hook(_stamper(stamps, f"b{index}e")))
    return handles


def _stamper(stamps: Stamps, name: str) -> Callable[..., None]:
    def hook(*_: Any) -> None:
        stamps.mark(name)

    return hook


def _first_block_hook(stamps: Stamps) -> Callable[..., None]:
    """Block 0's forward end; and a hook on its output's gradient, which stamps its backward start."""

    def hook(_module: nn.Module, _inputs: Any, output: Tensor) -> None:
        stamps.mark("f0e")
        if output.requires_grad:
            output.register_hook(lambda _grad: stamps.mark("b0s"))

    return hook


def run_layer_timings(point: CalibrationPoint, device: torch.device) -> list[dict[str, Any]]:
    """One entry per batch size: every timed step's parts (see the module docstring), in seconds."""
    precision = point.precisions[0]
    try:
        execution = configure_execution(precision, False, False, device)
    except DdlbenchError as exc:
        return [{"kind": "layer_timings", "precision": precision, "error": str(exc)}]
    dataset = DATASETS.get(point.dataset)
    model = build_timed_model(point, device)
    blocks = [type(block).__name__ for block in model.children()]
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    loss_fn = loss_for(dataset.task)
    stamps = Stamps(device)
    handles = attach_hooks(model, stamps)
    inputs, targets = open_dataset(dataset, seed=SEED).batch(0, max(point.batch_sizes))
    inputs, targets = inputs.to(device), targets.to(device)
    last = len(blocks) - 1

    def step(x: Tensor, y: Tensor) -> None:
        stamps.mark("start")
        optimizer.zero_grad(set_to_none=True)
        stamps.mark("zero_grad")
        with execution.autocast():
            output = model(x)
            stamps.mark("loss_start")
            loss = loss_fn(output, y)
            stamps.mark("loss_end")
        stamps.mark("backward")
        execution.backward(loss)
        stamps.mark("b0e")  # block 0's backward ends with backward()
        stamps.mark("update_start")
        execution.optimizer_step(optimizer)
        stamps.mark("end")

    # per batch size: the step's parts, and each block's forward and backward times, one entry per timed step
    collected: dict[int, tuple[dict[str, list[float]], list[list[float]], list[list[float]]]] = {
        batch: (
            {"loss_s": [], "update_s": [], "step_s": [], "other_s": []},
            [[] for _ in blocks],
            [[] for _ in blocks],
        )
        for batch in point.batch_sizes
    }

    def timed(batch: int) -> None:
        step(inputs[:batch], targets[:batch])
        t = stamps.seconds()
        parts, forward, backward = collected[batch]
        for index in range(len(blocks)):
            forward[index].append(t[f"f{index}e"] - t[f"f{index}s"])
            # a block whose output needs no gradient (none of the catalog's) has no backward
            backward[index].append(t[f"b{index}e"] - t.get(f"b{index}s", t[f"b{index}e"]))
        loss = (t["loss_end"] - t["loss_start"]) + (t[f"b{last}s"] - t["backward"])
        update = (t["zero_grad"] - t["start"]) + (t["end"] - t["update_start"])
        attributed = sum(column[-1] for column in forward + backward) + loss + update
        parts["loss_s"].append(loss)
        parts["update_s"].append(update)
        parts["step_s"].append(t["end"])
        parts["other_s"].append(t["end"] - attributed)

    for batch in point.batch_sizes:
        for _ in range(point.warmup):
            step(inputs[:batch], targets[:batch])
            stamps.seconds()
    if dist.is_initialized():
        dist.barrier()
    for round_index in range(point.iterations):
        order = point.batch_sizes if round_index % 2 == 0 else point.batch_sizes[::-1]
        for batch in order:
            timed(batch)
    out = []
    for batch in point.batch_sizes:
        parts, forward, backward = collected[batch]
        blocks_out = [
            {"name": name, "forward_s": f, "backward_s": b}
            for name, f, b in zip(blocks, forward, backward, strict=True)
        ]
        out.append(
            {"kind": "layer_timings", "precision": precision, "batch_size": batch, "blocks": blocks_out, **parts}
        )
    for handle in handles:
        handle.remove()
    return out
