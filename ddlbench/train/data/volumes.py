"""Real volume datasets (CosmoFlow-like): NumPy or HDF5 files of volumes x and regression targets y.

A file holds one sample (x: C×D×H×W, y: outputs) or several (x: N×C×D×H×W, y: N×outputs). Volumes
may also be stored channels-last (D×H×W×C, as the CosmoFlow data is); they are transposed on read.
Only the shapes are read when the dataset is opened; the voxels are read per batch request, since a
128³×4 volume is 32 MiB as float32 and a dataset holds thousands of them.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from ddlbench.catalog import DatasetSpec
from ddlbench.catalog.data_layout import DataPathError, locate_volume_files, volume_label_file
from ddlbench.train.data.order import sample_order, take

Layout = Literal["channels_first", "channels_last"]


@dataclass(frozen=True, kw_only=True)
class VolumeFile:
    """One file's samples: where x and y are, how many samples, and how x is laid out."""

    path: Path
    samples: int
    stacked: bool  # x has a leading sample dimension
    layout: Layout


def _npy_header(stream) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(stream)
    reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = reader(stream)
    return shape, dtype


def _shapes(path: Path) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of x and y in one volume file, read from headers only."""
    try:
        if path.suffix == ".npy":
            with open(path, "rb") as stream, open(volume_label_file(path), "rb") as label_stream:
                return _npy_header(stream)[0], _npy_header(label_stream)[0]
        if path.suffix == ".npz":
            with zipfile.ZipFile(path) as archive:
                members = set(archive.namelist())
                if not {"x.npy", "y.npy"} <= members:
                    raise DataPathError(path, f"expected arrays x and y in the .npz; it has {sorted(members)}")
                shapes = []
                for name in ("x.npy", "y.npy"):
                    with archive.open(name) as stream:
                        shapes.append(_npy_header(stream)[0])
                return shapes[0], shapes[1]
        import h5py

        with h5py.File(path, "r") as file:
            missing = [name for name in ("x", "y") if not isinstance(file.get(name), h5py.Dataset)]
            if missing:
                raise DataPathError(path, f"expected HDF5 datasets x and y; missing {', '.join(missing)}")
            return tuple(file["x"].shape), tuple(file["y"].shape)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise DataPathError(path, f"could not be read as a volume file: {error}") from None


def _describe(spec: DatasetSpec, path: Path) -> VolumeFile:
    x_shape, y_shape = _shapes(path)
    channels, *space = spec.sample_shape
    layouts: dict[tuple[int, ...], Layout] = {
        tuple(spec.sample_shape): "channels_first",
        (*space, channels): "channels_last",
    }
    stacked = len(x_shape) == len(spec.sample_shape) + 1
    sample_shape = x_shape[1:] if stacked else x_shape
    samples = x_shape[0] if stacked else 1
    if sample_shape not in layouts:
        raise DataPathError(
            path,
            f"holds volumes x of shape {x_shape}; {spec.name} expects {spec.sample_shape} (C×D×H×W, or D×H×W×C), "
            "optionally with a leading sample dimension",
        )
    expected_y = (samples, spec.num_outputs) if stacked else (spec.num_outputs,)
    if y_shape != expected_y:
        raise DataPathError(path, f"holds targets y of shape {y_shape}; expected {expected_y} for x of shape {x_shape}")
    return VolumeFile(path=path, samples=samples, stacked=stacked, layout=layouts[sample_shape])


def scan_volumes(spec: DatasetSpec, root: Path) -> tuple[VolumeFile, ...]:
    """Every volume file's description (headers only), read once when the dataset is opened."""
    files = tuple(_describe(spec, path) for path in locate_volume_files(root))
    if not sum(file.samples for file in files):
        raise DataPathError(root, "holds no volumes (every x has 0 samples)")
    return files


def _read(file: VolumeFile, row: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample `row` of one file as (x in its stored layout, y)."""
    pick = (row,) if file.stacked else ()
    if file.path.suffix == ".npy":
        x = np.load(file.path, mmap_mode="r")[pick]
        y = np.load(volume_label_file(file.path), mmap_mode="r")[pick]
        return np.asarray(x), np.asarray(y)
    if file.path.suffix == ".npz":
        with np.load(file.path) as arrays:
            return arrays["x"][pick], arrays["y"][pick]
    import h5py

    with h5py.File(file.path, "r") as stored:
        return stored["x"][pick], stored["y"][pick]


class VolumeFiles:
    """Volumes and targets from a folder of .npy/.npz/.h5 files, served in a seed-determined order."""

    def __init__(self, spec: DatasetSpec, root: Path, *, seed: int) -> None:
        self.spec = spec
        self.files = scan_volumes(spec, root)
        # global sample k is row k - first[f] of file f
        self._first = np.cumsum([0] + [file.samples for file in self.files])
        self.order = sample_order(int(self._first[-1]), seed)

    def __len__(self) -> int:
        return int(self._first[-1])

    def batch(self, start: int, size: int) -> tuple[Tensor, Tensor]:
        """Samples start .. start+size-1 of the permuted order, as (volumes N×C×D×H×W float32, targets N×k float32)."""
        volumes = torch.empty(size, *self.spec.sample_shape)
        targets = torch.empty(size, self.spec.num_outputs)
        for offset, sample in enumerate(take(self.order, start, size)):
            index = int(np.searchsorted(self._first, sample, side="right")) - 1
            file = self.files[index]
            x, y = _read(file, int(sample - self._first[index]))
            if file.layout == "channels_last":
                x = np.moveaxis(x, -1, 0)
            volumes[offset] = torch.from_numpy(np.array(x, dtype=np.float32))  # a copy: memory maps are read-only
            targets[offset] = torch.from_numpy(np.array(y, dtype=np.float32))
        return volumes, targets
