"""Where a rank's communication is stamped: every path a strategy's collectives take on the CPU.

- torch.distributed's functions (all_reduce, all_gather_into_tensor, reduce_scatter_tensor, send,
  batch_isend_irecv…), wrapped in place (`install()`): our hand-written strategies, FSDP2 (it calls
  `dist.all_gather_single`/`dist.reduce_scatter_single`) and torch.distributed.pipelining (its
  `dist.batch_isend_irecv`, and `isend`/`irecv` through P2POp) all look them up on the module at each
  call. A synchronous call is in
  flight and blocks for its whole duration. An asynchronous one is issued at the call; its Work is
  handed back wrapped so each `wait()` is a blocked interval; its completion is observed through the
  Work's future where gloo gives one (collectives), else bounded by the end of the last wait
  (gloo's point-to-point Work has no future).
- DTensor's functional collectives (torch.distributed._functional_collectives: all_reduce,
  all_gather_tensor, reduce_scatter_tensor, all_to_all_single…), wrapped the same way: issued at the
  call, waited in `wait_tensor`, which AsyncCollectiveTensor calls when the result is first used.
- DDP's broadcast of buffers (BatchNorm's running statistics) from rank 0 at the start of every forward
  (`dist._broadcast_coalesced`, wrapped like the others): where a rank waits for a straggler before its
  gradients are even computed.
- DDP's buckets, through a communication hook (`trace_ddp`) that does what DDP's default does
  (divide by the group's size, all-reduce, hand back the buffer) and stamps each bucket's issue (the
  bucket is ready) and completion (its future's callback, on gloo's thread).
- Horovod's gradient all-reduces (`trace_horovod`): each gradient's submission by its hook, and the
  wait in synchronize(); Horovod's background thread does not say when each finished, so completion
  is bounded by the end of that wait.

Not traced: CUDA (NCCL runs on its own streams; host stamps around its calls would time their
launch, not the transfer) — there the record says so, and only the phases are stamped.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ddlbench.train.recording import recorder as _rec

# function → index of the argument whose bytes this rank contributes (None: no payload)
DIST_PAYLOAD: dict[str, int | None] = {
    "all_reduce": 0,
    "all_reduce_coalesced": 0,
    "broadcast": 0,
    "reduce": 0,
    "all_gather": 1,
    "all_gather_into_tensor": 1,
    "all_gather_single": 1,
    "reduce_scatter": 1,
    "reduce_scatter_tensor": 1,
    "reduce_scatter_single": 1,
    "all_to_all": 1,
    "all_to_all_single": 1,
    "gather": 0,
    "scatter": 0,
    "send": 0,
    "recv": 0,
    "isend": 0,
    "irecv": 0,
    "batch_isend_irecv": 0,
    "barrier": None,
    # DDP's broadcast of rank 0's buffers (BatchNorm statistics) at every forward, synchronous
    "_broadcast_coalesced": 1,
}
PAYLOAD_KEYWORDS = ("tensor", "input_tensor", "input", "tensor_list", "input_tensor_list", "p2p_op_list")
ALWAYS_ASYNC = frozenset({"isend", "irecv", "batch_isend_irecv"})
FUNCOL_OPS = ("all_reduce", "all_gather_tensor", "all_gather_single", "reduce_scatter_tensor", "all_to_all_single")

_ORIGINALS: dict[tuple[Any, str], Callable[..., Any]] = {}
_PENDING_FUNCOL: dict[int, _rec.CommEvent] = {}
_depth = 0  # > 0 inside a traced call: what it calls in turn is part of it


def install() -> None:
    """Wrap torch.distributed's and the functional collectives' functions (idempotent, process-wide)."""
    from torch.distributed import _functional_collectives as funcol
    from torch.distributed import distributed_c10d

    for name, payload in DIST_PAYLOAD.items():
        if hasattr(dist, name):
            # the same wrapper in both namespaces: P2POp accepts only `isend`/`irecv` as distributed_c10d
            # names them (by identity), and callers pass them as torch.distributed names them
            traced = _wrap(dist, name, functools.partial(_traced_dist_call, name, payload))
            if getattr(distributed_c10d, name, None) is _ORIGINALS[(dist, name)]:
                _ORIGINALS[(distributed_c10d, name)] = _ORIGINALS[(dist, name)]
                setattr(distributed_c10d, name, traced)
    for name in FUNCOL_OPS:
        if hasattr(funcol, name):
            _wrap(funcol, name, functools.partial(_traced_funcol_call, name))
    if hasattr(funcol, "wait_tensor"):
        _wrap(funcol, "wait_tensor", _traced_wait_tensor)


def uninstall() -> None:
    for (module, name), original in _ORIGINALS.items():
        setattr(module, name, original)
    _ORIGINALS.clear()


def original(name: str) -> Callable[..., Any]:
    """torch.distributed's own function, untraced."""
    return _ORIGINALS.get((dist, name), getattr(dist, name))


def _wrap(module: Any, name: str, make: Callable[..., Any]) -> Callable[..., Any]:
    if (module, name) in _ORIGINALS:
        return getattr(module, name)
    fn = getattr(module, name)
    _ORIGINALS[(module, name)] = fn
    traced = functools.wraps(fn)(functools.partial(make, fn, _async_index(fn)))
    setattr(module, name, traced)
    return traced


def _async_index(fn: Callable[..., Any]) -> int | None:
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("async_op") if "async_op" in names else None


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_nbytes(item) for item in value)
    tensor = getattr(value, "tensor", None)  # a P2POp
    return _nbytes(tensor) if tensor is not None else 0


def _group_size(kwargs: dict[str, Any]) -> int:
    group = kwargs.get("group")
    try:
        return dist.get_world_size(group) if not isinstance(group, tuple) else 0
    except (RuntimeError, ValueError, TypeError):
        return 0


def _traced_dist_call(name: str, payload: int | None, fn: Callable[..., Any], async_index: int | None, *args, **kwargs):
    global _depth
    recorder = _rec.current()
    if recorder is None or recorder._step is None or _depth:
        return fn(*args, **kwargs)
    nbytes = 0
    if payload is not None:
        keyword = next((kwargs[k] for k in PAYLOAD_KEYWORDS if k in kwargs), None)
        nbytes = _nbytes(args[payload] if len(args) > payload else keyword)
    is_async = name in ALWAYS_ASYNC or bool(
        kwargs.get("async_op") or (async_index is not None and len(args) > async_index and args[async_index])
    )
    event = recorder.comm_issued(name, nbytes, _group_size(kwargs))
    _depth += 1
    try:
        result = fn(*args, **kwargs)
    finally:
        _depth -= 1
    if not is_async or result is None:
        if event is not None:
            end = recorder.mark()
            event.waits.append((event.issued, end))
            event.completed = end
        return result
    if isinstance(result, list):
        return [_TracedWork(work, event, recorder) for work in result]
    return _TracedWork(result, event, recorder)


class _TracedWork:
    """A Work whose waits are stamped; its future's callback stamps completion where gloo provides one."""

    __slots__ = ("_event", "_recorder", "_work")

    def __init__(self, work: Any, event: _rec.CommEvent | None, recorder: _rec.IterationRecorder) -> None:
        self._work, self._event, self._recorder = work, event, recorder
        if event is not None:
            # gloo's point-to-point Work has no future (RuntimeError): the last wait bounds its completion
            with contextlib.suppress(RuntimeError):
                work.get_future().then(lambda _: recorder.comm_completed(event))

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        with self._recorder.blocked(self._event):
            return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _traced_funcol_call(name: str, fn: Callable[..., Any], async_index: int | None, *args, **kwargs):
    global _depth
    recorder = _rec.current()
    if recorder is None or recorder._step is None or _depth:
        return fn(*args, **kwargs)
    event = recorder.comm_issued(f"funcol.{name}", _nbytes(args[0]) if args else 0)
    _depth += 1
    try:
        result = fn(*args, **kwargs)
    finally:
        _depth -= 1
    elem = getattr(result, "elem", None)
    if event is not None:
        if isinstance(elem, torch.Tensor):
            # keyed by storage: AsyncCollectiveTensor hands views of its result on as new wrappers, and
            # the first use of any of them waits for this collective
            _PENDING_FUNCOL[_storage_key(elem)] = event
        else:  # waited already (traced graphs): the call was the whole collective
            end = recorder.mark()
            event.waits.append((event.issued, end))
    return result


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _traced_wait_tensor(fn: Callable[..., Any], async_index: int | None, tensor: Any, *args, **kwargs):
    event = _PENDING_FUNCOL.pop(_storage_key(tensor), None) if _PENDING_FUNCOL else None
    recorder = _rec.current()
    if event is None or recorder is None:
        return fn(tensor, *args, **kwargs)
    with recorder.blocked(event):
        return fn(tensor, *args, **kwargs)


# -- DDP ------------------------------------------------------------------------------------------------------
def trace_ddp(model: torch.nn.parallel.DistributedDataParallel, group: dist.ProcessGroup | None = None) -> None:
    """Register a communication hook that averages each bucket as DDP's default does, and stamps it.

    The default (torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook): divide the
    bucket by the group's size, all-reduce it asynchronously, hand the buffer back. CPU only: on CUDA the
    model keeps DDP's built-in reduction (in C++, no Python per bucket; collectives are not traced there).

    With a hook the reducer no longer folds the division into its copy of the gradients into the bucket, so
    the hook's division is a pass of its own over every bucket. On a group of one it divides by 1 and is
    skipped: a one-rank DDP then costs what torch's own does (vgg11 on 1×28² at batch 8, one 2-core rank,
    2026-12-07: backward 62.6 ms plain, 80.4 under DDP, 86.0 with the division; on 3×160² at batch 2, 352,
    519 and 560 ms)."""
    if any(parameter.is_cuda for parameter in model.parameters()):
        return
    model.register_comm_hook(group, _ddp_bucket_hook)


def _ddp_bucket_hook(group, bucket):
    buffer = bucket.buffer()
    size = dist.get_world_size(group)
    recorder = _rec.current()
    event = None
    if recorder is not None:
        event = recorder.comm_issued("ddp_bucket", buffer.numel() * buffer.element_size(), size, tail=True)
    if size > 1:  # x / 1 is x: no pass over the bucket for it
        buffer.div_(size)
    future = original("all_reduce")(buffer, group=group, async_op=True).get_future()

    def done(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        if recorder is not None:
            recorder.comm_completed(event)
        return fut.value()[0]

    return future.then(done)


# -- Horovod --------------------------------------------------------------------------------------------------
def trace_horovod(optimizer: Any) -> None:
    """Stamp a Horovod DistributedOptimizer: each gradient's all-reduce submitted by its hook, and
    synchronize()'s wait for all of them (which also bounds their completion)."""
    submit, synchronize = optimizer._allreduce_grad_async, optimizer.synchronize
    pending: list[_rec.CommEvent] = []

    def traced_submit(p: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        recorder = _rec.current()
        if recorder is not None:
            event = recorder.comm_issued("horovod_allreduce", p.numel() * p.element_size())
            if event is not None:
                pending.append(event)
        return submit(p, *args, **kwargs)

    def traced_synchronize(*args: Any, **kwargs: Any) -> Any:
        recorder = _rec.current()
        if recorder is None or not pending:
            return synchronize(*args, **kwargs)
        start = recorder.mark()
        try:
            return synchronize(*args, **kwargs)
        finally:
            end = recorder.mark()
            for event in pending:
                event.waits.append((start, end))
            pending.clear()

    optimizer._allreduce_grad_async = traced_submit
    optimizer.synchronize = traced_synchronize
