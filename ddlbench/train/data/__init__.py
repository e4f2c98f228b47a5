"""Datasets a rank reads batches from: synthetic by default, real data from local files when a path is given.

Every source addresses samples by global index, so any split of a global batch over ranks sees what
one process would. Real data is served in a seed-determined permutation (global index i is stored
sample order[i mod N]), the same in every process. Importing this package does not import torch, so
`layout` can check `data:` paths at plan time.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ddlbench.catalog import DatasetSpec
from ddlbench.catalog.data_layout import DataPathError, find_layout_problem, format_of, require_existing

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["BatchSource", "DataPathError", "find_layout_problem", "open_dataset"]


class BatchSource(Protocol):
    """Samples by global index: any split of a global batch over ranks sees what one process would."""

    def batch(self, start: int, size: int) -> tuple[Tensor, Tensor]:
        """Samples start .. start+size-1 as (inputs, targets), on the CPU."""
        ...


def open_dataset(spec: DatasetSpec, *, seed: int, path: str | Path | None = None) -> BatchSource:
    """The dataset's batch source: real data read from `path` when given, else synthetic samples from `seed`.

    Real data that is missing or malformed raises DataPathError, naming the path and what was expected.
    """
    if not path:
        from ddlbench.train.data.synthetic import open_synthetic

        return open_synthetic(spec, seed=seed)
    if not spec.real_data:
        raise DataPathError(path, f"{spec.name} is synthetic only; it reads no real data")
    root = Path(path).expanduser()
    require_existing(root)
    kind = format_of(spec)
    if kind == "idx":
        from ddlbench.train.data.images import open_mnist

        return open_mnist(spec, root, seed=seed)
    if kind == "cifar_bin":
        from ddlbench.train.data.images import open_cifar10

        return open_cifar10(spec, root, seed=seed)
    if kind == "image_folder":
        from ddlbench.train.data.images import ImageFolder

        return ImageFolder(spec, root, seed=seed)
    if kind == "volumes":
        from ddlbench.train.data.volumes import VolumeFiles

        return VolumeFiles(spec, root, seed=seed)
    from ddlbench.train.data.tokens import TokenFile

    return TokenFile(spec, root, seed=seed)
