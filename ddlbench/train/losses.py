"""The loss of each task, as a mean over a batch; a micro-batch mean of equal pieces averages to it."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ddlbench.catalog import Task


def classify_loss(output: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy of N×classes logits against N class ids."""
    return F.cross_entropy(output, target)


def regress_loss(output: Tensor, target: Tensor) -> Tensor:
    """Mean squared error of N×k predictions against N×k targets."""
    return F.mse_loss(output, target)


def language_loss(output: Tensor, target: Tensor) -> Tensor:
    """Cross-entropy of N×T×vocab logits against the N×T next tokens, averaged over every position."""
    return F.cross_entropy(output.flatten(0, 1), target.flatten())


LOSSES = {"classify": classify_loss, "regress": regress_loss, "language": language_loss}


def loss_for(task: Task):
    return LOSSES[task]
