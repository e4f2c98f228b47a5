"""A tensor-level memory peak on the CPU, where there is no allocator to ask.

Peak RSS counts the whole process (allocator caches, oneDNN scratch, gloo buffers, the interpreter):
3-6× the tensors on small models. This counts tensor storages instead: the bytes alive when one
step starts (parameters, gradients, optimizer state, anything a strategy keeps) plus the highest
point reached by storages allocated during the step, seen through a dispatch mode.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def live_storages(device_type: str, exclude: Iterable[torch.Tensor] = ()) -> dict[int, int]:
    """data_ptr -> bytes of every distinct storage the Python heap references on this device type."""
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    found: dict[int, int] = {}
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        objects = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in objects:
        if obj.device.type == device_type and not obj.is_meta:
            try:
                storage = _local(obj).untyped_storage()
            except (RuntimeError, NotImplementedError):  # tensor subclasses without a storage
                continue
            pointer = storage.data_ptr()
            if pointer and pointer not in excluded:
                found[pointer] = storage.nbytes()
    return found


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class TensorPeak(TorchDispatchMode):
    """Within the `with` block: peak bytes of storages allocated there and still alive, over the
    bytes that were alive at its start (`resident_bytes`). `peak_bytes` is their sum."""

    def __init__(self, device_type: str = "cpu", exclude: Iterable[torch.Tensor] = ()) -> None:
        super().__init__()
        self.device_type = device_type
        self._exclude = tuple(exclude)
        self._known: set[int] = set()
        self._new: dict[int, int] = {}
        self.resident_bytes = 0
        self.step_live_bytes = 0
        self.step_peak_bytes = 0

    @property
    def peak_bytes(self) -> int:
        return self.resident_bytes + self.step_peak_bytes

    def __enter__(self):
        resident = live_storages(self.device_type, self._exclude)
        self._known = set(resident)
        self.resident_bytes = sum(resident.values())
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.device.type == self.device_type:
                try:  # a DTensor (FSDP2, tensor parallel) owns no storage: count its local shard
                    self._track(_local(leaf).untyped_storage())
                except (RuntimeError, NotImplementedError):  # other storage-less subclasses
                    continue
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        pointer = storage.data_ptr()
        if not pointer or pointer in self._known or pointer in self._new:
            return
        size = storage.nbytes()
        self._new[pointer] = size
        self.step_live_bytes += size
        self.step_peak_bytes = max(self.step_peak_bytes, self.step_live_bytes)
        weakref.finalize(storage, self._release, pointer)

    def _release(self, pointer: int) -> None:
        size = self._new.pop(pointer, 0)
        self.step_live_bytes -= size
