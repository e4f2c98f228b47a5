"""Single-process reference training, to check parallel strategies against."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ddlbench.catalog import DATASETS
from ddlbench.point import Point
from ddlbench.train.kernel import MOMENTUM, build_model, step_batches
from ddlbench.train.losses import loss_for


def build_model_as(point: Point, dtype: torch.dtype) -> nn.Module:
    """The point's model with its weights drawn in `dtype` (float32 is the kernel's `build_model`)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return build_model(point)
    finally:
        torch.set_default_dtype(previous)


def as_dtype(inputs: Tensor, dtype: torch.dtype) -> Tensor:
    """Samples in the model's dtype; token ids stay integers. The data is drawn in float32 either way."""
    return inputs.to(dtype) if inputs.is_floating_point() else inputs


def train_reference(
    point: Point,
    *,
    shards: int = 1,
    dtype: torch.dtype = torch.float32,
    steps: int | None = None,
    device: torch.device | None = None,
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Train the point's model in one process over the same global batches as the parallel run.

    With shards > 1 each global batch is cut into `shards` equal slices whose gradients are averaged,
    which is what data parallelism computes when a layer (BatchNorm) depends on the whole local batch,
    and what a pipeline computes over its micro-batches. It runs on the point's `threads`, like each
    of its ranks, so a second thread count regroups the reference's sums too.
    `steps` stops early (default: the point's warm-up and measured steps).
    `device` trains on another device (CUDA, for the GPU tests); the state comes back on the CPU.
    Returns the final state dict and the loss of each step (mean over shards).
    """
    device = device or torch.device("cpu")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(point.threads)
    try:
        with device:
            model = build_model_as(point, dtype)
        loss_fn = loss_for(DATASETS.get(point.dataset).task)
        optimizer = torch.optim.SGD(model.parameters(), lr=point.learning_rate, momentum=MOMENTUM)
        batches = step_batches(point, 0, point.global_batch_size, device)
        losses = []
        for step in range(point.warmup_steps + point.steps if steps is None else steps):
            inputs, targets = batches[step % len(batches)]
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for x, y in zip(inputs.chunk(shards), targets.chunk(shards), strict=True):
                loss = loss_fn(model(as_dtype(x, dtype)), y) / shards
                loss.backward()
                total += loss.item()
            optimizer.step()
            losses.append(total)
    finally:
        torch.set_num_threads(previous_threads)
    return {name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()}, losses
