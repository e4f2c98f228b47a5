"""Synthetic datasets, deterministic per sample index and seed, so any split of a global batch over
ranks sees exactly the samples a single process would see."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ddlbench.catalog import DatasetSpec

_LABEL_STREAM = 0x5EED_1AB1  # separates the label projection's random stream from the samples'


class SyntheticImages:
    """Sample i is N(0, 1) noise from a generator seeded by (seed, i); its label is a fixed function
    of the image (argmax of a random projection of its 4×4-pooled channels), so the loss can fall."""

    def __init__(self, spec: DatasetSpec, *, seed: int) -> None:
        self.spec = spec
        self.seed = seed
        channels = spec.sample_shape[0]
        generator = torch.Generator().manual_seed(seed ^ _LABEL_STREAM)
        self._projection = torch.randn(spec.num_classes, channels * 16, generator=generator)

    def batch(self, start: int, size: int) -> tuple[Tensor, Tensor]:
        """Samples start .. start+size-1, as (images N×C×H×W float32, labels N int64)."""
        generator = torch.Generator()
        images = torch.empty(size, *self.spec.sample_shape)
        for offset in range(size):
            generator.manual_seed((self.seed << 32) + start + offset)
            images[offset] = torch.randn(self.spec.sample_shape, generator=generator)
        pooled = F.adaptive_avg_pool2d(images, 4).flatten(1)
        labels = (pooled @ self._projection.T).argmax(dim=1)
        return images, labels
