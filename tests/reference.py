"""Single-process reference training, to check parallel strategies against."""

from __future__ import annotations

import torch

from ddlbench.catalog import DATASETS
from ddlbench.point import Point
from ddlbench.train.kernel import MOMENTUM, build_model, step_batches
from ddlbench.train.losses import loss_for


def train_reference(point: Point, *, shards: int = 1) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Train the point's model in one process over the same global batches as the parallel run.

    With shards > 1 each global batch is cut into `shards` equal slices whose gradients are averaged,
    which is what data parallelism computes when a layer (BatchNorm) depends on the whole local batch,
    and what a pipeline computes over its micro-batches.
    Returns the final state dict and the loss of each step (mean over shards).
    """
    torch.set_num_threads(1)
    model = build_model(point)
    loss_fn = loss_for(DATASETS.get(point.dataset).task)
    optimizer = torch.optim.SGD(model.parameters(), lr=point.learning_rate, momentum=MOMENTUM)
    batches = step_batches(point, 0, point.global_batch_size, torch.device("cpu"))
    losses = []
    for step in range(point.warmup_steps + point.steps):
        inputs, targets = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for x, y in zip(inputs.chunk(shards), targets.chunk(shards), strict=True):
            loss = loss_fn(model(x), y) / shards
            loss.backward()
            total += loss.item()
        optimizer.step()
        losses.append(total)
    return {name: value.detach().clone() for name, value in model.state_dict().items()}, losses
