"""Where each real-data format keeps its files: found by listing folders only, without torch or parsing.

The readers locate their files here, and the same functions can check a sweep's `data:` paths at plan
time (`find_layout_problem`) on a login node, so a wrong folder fails before any job is submitted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from ddlbench.catalog import DatasetSpec
from ddlbench.errors import DdlbenchError

Format = Literal["idx", "cifar_bin", "image_folder", "volumes", "tokens"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
VOLUME_SUFFIXES = (".npy", ".npz", ".h5", ".hdf5")
TOKEN_SUFFIXES = (".bin", ".npy")
# MLPerf HPC's CosmoFlow numpy layout: <name>data.npy holds a volume, <name>label.npy its targets
VOLUME_DATA_END, VOLUME_LABEL_END = "data.npy", "label.npy"
CIFAR_BATCHES = tuple(f"data_batch_{number}.bin" for number in range(1, 6))
# torchvision's download keeps MNIST under MNIST/raw; the IDX names come with '-' or '.' before idx
MNIST_SUBFOLDERS = (".", "raw", "MNIST/raw")
MNIST_NAMES = {
    "images": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "labels": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
}


class DataPathError(DdlbenchError):
    """Real data that is missing or not in the expected format; names the path and what was expected."""

    def __init__(self, path: Path | str, expected: str) -> None:
        self.path = Path(path)
        super().__init__(f"{path}: {expected}")


def format_of(spec: DatasetSpec) -> Format:
    """The on-disk format a dataset's `data:` path is read in."""
    if spec.name == "mnist":
        return "idx"
    if spec.name == "cifar10":
        return "cifar_bin"
    return {"image2d": "image_folder", "volume3d": "volumes", "tokens": "tokens"}[spec.input_kind]


def find_layout_problem(spec: DatasetSpec, path: str | Path) -> str | None:
    """None when `path` has the files `spec`'s format needs (by name only), else why not."""
    locate = {
        "idx": locate_mnist,
        "cifar_bin": locate_cifar,
        "image_folder": locate_class_folders,
        "volumes": locate_volume_files,
        "tokens": locate_token_file,
    }[format_of(spec)]
    try:
        locate(Path(path))
    except DataPathError as error:
        return str(error)
    return None


def require_existing(path: Path) -> None:
    if not path.exists():
        raise DataPathError(path, "does not exist (real data is read from local files, never downloaded)")


def locate_mnist(root: Path) -> tuple[Path, Path]:
    """The training images and labels IDX files (optionally gzipped) under `root`."""
    require_existing(root)
    expected = (
        "expected a folder with the MNIST IDX files train-images-idx3-ubyte and train-labels-idx1-ubyte "
        "(optionally .gz)"
    )
    if not root.is_dir():
        raise DataPathError(root, expected)
    for sub in MNIST_SUBFOLDERS:
        folder = root / sub
        found = {kind: _first_existing(folder, names) for kind, names in MNIST_NAMES.items()}
        if found["images"] and found["labels"]:
            return found["images"], found["labels"]
    raise DataPathError(root, expected)


def _first_existing(folder: Path, names: tuple[str, ...]) -> Path | None:
    for name in names:
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def locate_cifar(root: Path) -> list[Path]:
    """The CIFAR-10 binary training batches under `root` (or its cifar-10-batches-bin folder)."""
    require_existing(root)
    folder = root / "cifar-10-batches-bin" if (root / "cifar-10-batches-bin").is_dir() else root
    files = [folder / name for name in CIFAR_BATCHES if (folder / name).is_file()]
    if not files:
        raise DataPathError(
            root, "expected the CIFAR-10 binary version: a folder with data_batch_1.bin .. data_batch_5.bin"
        )
    return files


def locate_class_folders(root: Path) -> list[Path]:
    """The class folders of an ImageFolder tree, sorted by name (their order gives the class ids)."""
    require_existing(root)
    expected = "expected an ImageFolder tree <root>/<class>/<image>.jpg|jpeg|png"
    if not root.is_dir():
        raise DataPathError(root, expected)
    classes = sorted(entry for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if not classes:
        raise DataPathError(root, f"{expected}; it has no class folders")
    return classes


def locate_volume_files(root: Path) -> list[Path]:
    """The volume files of a folder (or the one file given), sorted; label files are not listed."""
    require_existing(root)
    expected = (
        f"expected volumes as .npz (arrays x and y), .h5 (datasets x and y) or <name>{VOLUME_DATA_END} with "
        f"<name>{VOLUME_LABEL_END} beside it"
    )
    if root.is_file():
        files = [root]
    else:
        files = sorted(
            entry
            for entry in root.iterdir()
            if entry.is_file() and entry.suffix in VOLUME_SUFFIXES and not entry.name.endswith(VOLUME_LABEL_END)
        )
    if not files:
        raise DataPathError(root, f"{expected}; found none")
    for file in files:
        if file.suffix not in VOLUME_SUFFIXES:
            raise DataPathError(file, expected)
        if file.suffix == ".npy":
            volume_label_file(file)
    return files


def volume_label_file(volume: Path) -> Path:
    """The targets file beside a <name>data.npy volume."""
    if not volume.name.endswith(VOLUME_DATA_END):
        raise DataPathError(
            volume, f"a .npy volume must be named <name>{VOLUME_DATA_END}, its targets <name>{VOLUME_LABEL_END}"
        )
    label = volume.with_name(volume.name[: -len(VOLUME_DATA_END)] + VOLUME_LABEL_END)
    if not label.is_file():
        raise DataPathError(volume, f"expected its targets in {label.name} beside it")
    return label


def locate_token_file(path: Path) -> Path:
    """The flat token-id array: the file given, or a folder's train.bin/train.npy or its only token file."""
    require_existing(path)
    expected = "expected a flat array of token ids: a .npy file or a .bin file of uint16 (nanoGPT's train.bin)"
    if path.is_file():
        if path.suffix not in TOKEN_SUFFIXES:
            raise DataPathError(path, expected)
        return path
    for name in ("train.bin", "train.npy"):
        if (path / name).is_file():
            return path / name
    candidates = sorted(entry for entry in path.iterdir() if entry.is_file() and entry.suffix in TOKEN_SUFFIXES)
    if len(candidates) != 1:
        found = ", ".join(entry.name for entry in candidates) or "none"
        raise DataPathError(
            path, f"{expected}; a folder must hold train.bin, train.npy or one such file (found {found})"
        )
    return candidates[0]
