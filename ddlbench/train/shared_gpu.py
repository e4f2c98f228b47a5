"""Ranks that share one GPU (a point with `share_gpus: true` on a host with fewer GPUs than ranks).

NCCL refuses two ranks on one device: on an H200 with NCCL 2.28.9 every collective of two ranks on
cuda:0 failed with "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device" (invalid usage;
benchmarks/gpu_probe.py, 2026-11-28). Such ranks meet over gloo instead (ddlbench.launch.devices), and
their tensors stay on the GPU, so each strategy runs its CUDA code. gloo takes CUDA tensors in its
collectives (the same probe: all_reduce, broadcast, all_gather, all_gather_into_tensor,
reduce_scatter_tensor, reduce_scatter and all_to_all_single gave the right sums), staging them
through host memory itself; its point-to-point transfers do not: send, recv and batch_isend_irecv of a
CUDA tensor failed with "gloo/transport/tcp/pair.cc: writev ... Bad address" (gloo handed the device
pointer to the socket).

`stage_point_to_point()` makes torch.distributed's send, recv, isend and irecv (and so
batch_isend_irecv and torch.distributed.pipelining, which call them) move a CUDA tensor through a host
copy: a send copies the tensor to the host (the copy waits for the stream, so the bytes are final) and
sends the copy; a receive fills a host buffer and copies it into the tensor when it is waited on. What
this measures is then not a GPU interconnect: a point on shared GPUs says so in its record (the
backend, every rank's GPU UUID), and is a check of the CUDA code paths, not a figure of the machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

P2P = ("send", "recv", "isend", "irecv")
_ORIGINAL: dict[str, Callable[..., Any]] = {}


def needs_staging(tensor: torch.Tensor) -> bool:
    """Whether a transfer of `tensor` goes through host memory (a CUDA tensor). Tests of the CPU path
    replace it to stage CPU tensors through copies too."""
    return tensor.is_cuda


def _host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().to("cpu", copy=True)


def _buffer(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")


def _fill(tensor: torch.Tensor, host: torch.Tensor) -> None:
    """The received bytes into the receiving tensor, as a transfer writes them: outside autograd (a
    pipeline stage receives into a leaf that requires grad)."""
    with torch.no_grad():
        tensor.copy_(host)


class StagedWork:
    """A point-to-point Work over host copies: waiting on it waits on the transfer, then copies a
    received buffer into its tensor (once)."""

    def __init__(self, work: Any, tensor: torch.Tensor, host: torch.Tensor, *, received: bool) -> None:
        self._work, self._tensor, self._host, self._received = work, tensor, host, received
        self._done = False

    def wait(self, timeout: Any = None) -> bool:
        if not self._done:
            if self._work is not None:
                self._work.wait() if timeout is None else self._work.wait(timeout)
            if self._received:
                _fill(self._tensor, self._host)
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _send(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    send = _ORIGINAL["send"]
    return send(_host(tensor), *args, **kwargs) if needs_staging(tensor) else send(tensor, *args, **kwargs)


def _recv(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    recv = _ORIGINAL["recv"]
    if not needs_staging(tensor):
        return recv(tensor, *args, **kwargs)
    host = _buffer(tensor)
    sender = recv(host, *args, **kwargs)
    _fill(tensor, host)
    return sender


def _isend(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    isend = _ORIGINAL["isend"]
    if not needs_staging(tensor):
        return isend(tensor, *args, **kwargs)
    host = _host(tensor)
    return StagedWork(isend(host, *args, **kwargs), tensor, host, received=False)


def _irecv(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    irecv = _ORIGINAL["irecv"]
    if not needs_staging(tensor):
        return irecv(tensor, *args, **kwargs)
    host = _buffer(tensor)
    return StagedWork(irecv(host, *args, **kwargs), tensor, host, received=True)


_STAGED = {"send": _send, "recv": _recv, "isend": _isend, "irecv": _irecv}


def stage_point_to_point() -> None:
    """Route torch.distributed's point-to-point calls through host copies (idempotent). Both names are
    replaced, the package's and distributed_c10d's: P2POp accepts only the latter's isend and irecv, and
    batch_isend_irecv tells a send from a receive by them."""
    if _ORIGINAL:
        return
    for name in P2P:
        _ORIGINAL[name] = getattr(c10d, name)
        setattr(c10d, name, _STAGED[name])
        setattr(dist, name, _STAGED[name])


def unstage() -> None:
    """Put torch.distributed's own point-to-point calls back."""
    for name, function in _ORIGINAL.items():
        setattr(c10d, name, function)
        setattr(dist, name, function)
    _ORIGINAL.clear()
