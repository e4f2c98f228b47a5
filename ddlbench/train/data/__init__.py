"""Datasets a rank reads batches from: synthetic by default, real data from local files when a path is given."""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

from ddlbench.catalog import DatasetSpec


class BatchSource(Protocol):
    """Samples by global index: any split of a global batch over ranks sees what one process would."""

    def batch(self, start: int, size: int) -> tuple[Tensor, Tensor]:
        """Samples start .. start+size-1 as (inputs, targets), on the CPU."""
        ...


def open_dataset(spec: DatasetSpec, *, seed: int, path: str | None = None) -> BatchSource:
    """The dataset's batch source: real data read from `path` when given, else synthetic samples from `seed`."""
    from ddlbench.train.data.synthetic import SyntheticImages

    if path:
        raise NotImplementedError("real data loaders are not written yet")
    return SyntheticImages(spec, seed=seed)
