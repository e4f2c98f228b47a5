"""Real image datasets: MNIST's IDX files and CIFAR-10's binary batches (held in memory as bytes),
and ImageFolder trees (decoded with Pillow per batch request)."""

from __future__ import annotations

import gzip
import logging
import math
import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ddlbench.catalog import DatasetSpec
from ddlbench.catalog.data_layout import (
    IMAGE_SUFFIXES,
    DataPathError,
    locate_cifar,
    locate_class_folders,
    locate_mnist,
)
from ddlbench.train.data.order import sample_order, take

log = logging.getLogger(__name__)

# per-channel mean and standard deviation of the training pixels scaled to [0, 1]: the usual constants
MNIST_MEAN_STD = ((0.1307,), (0.3081,))
CIFAR10_MEAN_STD = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
IMAGENET_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CIFAR_RECORD_BYTES = 1 + 3 * 32 * 32
# ImageNet evaluation's preprocessing: shorter side to 256 for a 224 crop, the same ratio at other sizes
RESIZE_RATIO = 256 / 224


def _normalise(pixels: Tensor, mean_std: tuple[tuple[float, ...], tuple[float, ...]]) -> Tensor:
    """uint8 N×C×H×W → float32 scaled to [0, 1], then standardised per channel."""
    mean, std = (torch.tensor(values).view(1, -1, 1, 1) for values in mean_std)
    return (pixels.float() / 255 - mean) / std


def _check_labels(path: Path, labels: np.ndarray, classes: int) -> None:
    if labels.size and int(labels.max()) >= classes:
        raise DataPathError(path, f"has label {int(labels.max())}; expected class ids below {classes}")


class ArrayImages:
    """Images and labels held in memory as bytes, served in a seed-determined order."""

    def __init__(
        self,
        *,
        pixels: np.ndarray,
        labels: np.ndarray,
        seed: int,
        mean_std: tuple[tuple[float, ...], tuple[float, ...]],
    ) -> None:
        self.pixels, self.labels, self.mean_std = pixels, labels, mean_std
        self.order = sample_order(len(labels), seed)

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, start: int, size: int) -> tuple[Tensor, Tensor]:
        """Samples start .. start+size-1 of the permuted order, as (images N×C×H×W float32, labels N int64)."""
        rows = take(self.order, start, size)
        images = _normalise(torch.from_numpy(self.pixels[rows]), self.mean_std)
        return images, torch.from_numpy(self.labels[rows].astype(np.int64))


def read_idx(path: Path, dimensions: int) -> np.ndarray:
    """An IDX file of unsigned bytes (magic 0x00 0x00 0x08 <dimensions>), optionally gzipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as stream:
            data = stream.read()
    except (OSError, EOFError) as error:  # a truncated or non-gzip .gz
        raise DataPathError(path, f"could not be read as an IDX file: {error}") from None
    expected = f"expected an IDX file of unsigned bytes with {dimensions} dimensions (magic 0x0000080{dimensions})"
    header = 4 + 4 * dimensions
    if len(data) < header or data[:4] != bytes((0, 0, 8, dimensions)):
        raise DataPathError(path, expected)
    shape = tuple(int.from_bytes(data[4 + 4 * d : 8 + 4 * d], "big") for d in range(dimensions))
    body = np.frombuffer(data, dtype=np.uint8, offset=header)
    if body.size != math.prod(shape):
        raise DataPathError(path, f"{expected}; its header says {shape} but it holds {body.size} bytes of data")
    return body.reshape(shape)


def open_mnist(spec: DatasetSpec, root: Path, *, seed: int) -> ArrayImages:
    images_path, labels_path = locate_mnist(root)
    images, labels = read_idx(images_path, 3), read_idx(labels_path, 1)
    if images.shape[1:] != spec.sample_shape[1:] or spec.sample_shape[0] != 1:
        raise DataPathError(images_path, f"holds {images.shape[1:]} images; {spec.name} expects {spec.sample_shape}")
    if len(images) != len(labels) or not len(labels):
        raise DataPathError(root, f"holds {len(images)} images and {len(labels)} labels; expected as many, at least 1")
    _check_labels(labels_path, labels, spec.num_classes)
    return ArrayImages(pixels=images[:, None], labels=labels, seed=seed, mean_std=MNIST_MEAN_STD)


def open_cifar10(spec: DatasetSpec, root: Path, *, seed: int) -> ArrayImages:
    if spec.sample_shape != (3, 32, 32):
        raise DataPathError(root, f"CIFAR-10 images are 3×32×32; {spec.name} expects {spec.sample_shape}")
    records = []
    for file in locate_cifar(root):
        data = np.fromfile(file, dtype=np.uint8)
        if data.size == 0 or data.size % CIFAR_RECORD_BYTES:
            raise DataPathError(
                file, f"holds {data.size} bytes; expected records of {CIFAR_RECORD_BYTES} (1 label + 3072 pixels)"
            )
        record = data.reshape(-1, CIFAR_RECORD_BYTES)
        _check_labels(file, record[:, 0], spec.num_classes)
        records.append(record)
    table = np.concatenate(records)
    log.info("CIFAR-10 from %s: %d images in %d batch files", root, len(table), len(records))
    pixels = table[:, 1:].reshape(-1, 3, 32, 32)
    return ArrayImages(pixels=pixels, labels=table[:, 0], seed=seed, mean_std=CIFAR10_MEAN_STD)


def scan_image_folder(root: Path) -> tuple[tuple[str, ...], tuple[tuple[Path, int], ...]]:
    """(class names, (file, class id) pairs) of an ImageFolder tree, sorted; listed once per rank (the
    kernel opens its dataset once), as listing a million files on a parallel file system is slow."""
    classes = locate_class_folders(root)
    files = []
    for label, folder in enumerate(classes):
        # scandir knows file types from the directory listing: no stat per file
        with os.scandir(folder) as entries:
            names = sorted(
                entry.name
                for entry in entries
                if os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES and entry.is_file()
            )
        files.extend((folder / name, label) for name in names)
    if not files:
        raise DataPathError(root, f"has no .jpg/.jpeg/.png images in its {len(classes)} class folders")
    return tuple(folder.name for folder in classes), tuple(files)


def load_image(file: Path, size: int) -> np.ndarray:
    """One image as uint8 3×size×size: RGB, shorter side resized to size·256/224, centre-cropped."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as image:
            image = image.convert("RGB")
    except (OSError, UnidentifiedImageError) as error:
        raise DataPathError(file, f"could not be decoded as an image: {error}") from None
    width, height = image.size
    short = round(size * RESIZE_RATIO)
    scale = short / min(width, height)
    resized = (max(short, round(width * scale)), max(short, round(height * scale)))
    if resized != image.size:
        image = image.resize(resized, Image.Resampling.BILINEAR)
    left, top = (resized[0] - size) // 2, (resized[1] - size) // 2
    image = image.crop((left, top, left + size, top + size))
    return np.asarray(image).transpose(2, 0, 1)


class ImageFolder:
    """An ImageFolder tree (classes sorted by name give the ids), decoded per batch request."""

    def __init__(self, spec: DatasetSpec, root: Path, *, seed: int) -> None:
        channels, height, width = spec.sample_shape
        if channels != 3 or height != width:
            raise DataPathError(root, f"images are read as square RGB crops; {spec.name} expects {spec.sample_shape}")
        self.size = height
        self.classes, self.files = scan_image_folder(root)
        if len(self.classes) > spec.num_classes:
            raise DataPathError(root, f"has {len(self.classes)} class folders; {spec.name} has {spec.num_classes}")
        self.order = sample_order(len(self.files), seed)

    def __len__(self) -> int:
        return len(self.files)

    def batch(self, start: int, size: int) -> tuple[Tensor, Tensor]:
        """Samples start .. start+size-1 of the permuted order, as (images N×3×S×S float32, labels N int64)."""
        rows = take(self.order, start, size)
        if not size:
            return torch.empty(0, 3, self.size, self.size), torch.empty(0, dtype=torch.int64)
        pixels = np.stack([load_image(self.files[row][0], self.size) for row in rows])
        labels = torch.tensor([self.files[row][1] for row in rows], dtype=torch.int64)
        return _normalise(torch.from_numpy(pixels), IMAGENET_MEAN_STD), labels
