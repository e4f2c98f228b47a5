"""Real token data: one flat array of token ids (.npy, or nanoGPT's .bin of uint16), memory-mapped and cut
into non-overlapping windows; window k starts at token k·T, and its targets are the window shifted by one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ddlbench.catalog import DatasetSpec
from ddlbench.catalog.data_layout import DataPathError, locate_token_file
from ddlbench.train.data.order import sample_order, take


def map_tokens(path: Path) -> np.ndarray:
    """The file's token ids as a read-only 1-D memory map (nothing is read yet)."""
    try:
        if path.suffix == ".bin":
            if path.stat().st_size % 2:
                raise DataPathError(path, "has an odd number of bytes; expected uint16 token ids (nanoGPT's .bin)")
            return np.memmap(path, dtype=np.uint16, mode="r")
        tokens = np.load(path, mmap_mode="r")
    except (OSError, ValueError) as error:
        raise DataPathError(path, f"could not be read as token ids: {error}") from None
    if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise DataPathError(path, f"holds a {tokens.dtype} array of shape {tokens.shape}; expected a 1-D integer array")
    return tokens


class TokenFile:
    """Windows of T+1 consecutive tokens (inputs, and targets one token on), in a seed-determined order."""

    def __init__(self, spec: DatasetSpec, path: Path, *, seed: int) -> None:
        self.spec = spec
        self.path = locate_token_file(path)
        self.tokens = map_tokens(self.path)
        (self.length,) = spec.sample_shape
        # the last window needs one token past its end for its last target
        windows = (len(self.tokens) - 1) // self.length
        if windows < 1:
            raise DataPathError(
                self.path, f"holds {len(self.tokens)} tokens; {spec.name} needs at least {self.length + 1}"
            )
        self.order = sample_order(windows, seed)

    def __len__(self) -> int:
        return len(self.order)

    def batch(self, start: int, size: int) -> tuple[Tensor, Tensor]:
        """Samples start .. start+size-1 of the permuted order, as (token ids N×T int64, targets N×T int64)."""
        windows = np.empty((size, self.length + 1), dtype=np.int64)
        for offset, window in enumerate(take(self.order, start, size)):
            begin = int(window) * self.length
            windows[offset] = self.tokens[begin : begin + self.length + 1]
        vocab = self.spec.num_outputs
        if windows.size and (windows.min() < 0 or windows.max() >= vocab):
            bad = int(windows.max()) if windows.max() >= vocab else int(windows.min())
            raise DataPathError(self.path, f"holds token id {bad}; {self.spec.name} expects ids in [0, {vocab})")
        tokens = torch.from_numpy(windows)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
