"""Memory of one rank: what it keeps between steps and the most it holds during one (bytes).

The figures mean what ddlbench measures (ddlbench.train.memory): `resident_bytes` is tensor memory at a
step's start (parameters, the previous step's gradients — every trainer frees them with
zero_grad(set_to_none=True) only once the next step begins —, optimizer state, communication buffers,
the model's buffers); `peak_bytes` is the most tensor memory at any moment of the step, the input
batch excepted (it is the benchmark's input pool, reported apart).

During the step the old gradients are gone; the backward pass walks the blocks in reverse, and while
block k runs its backward a rank holds the activations saved by blocks 0..k (of every micro-batch still
in flight), the gradients of blocks k..n−1 produced so far, and the gradient flowing between blocks
(the block's output and input gradients). The peak is the largest of these over k, plus what stays
(parameters, optimizer state, buffers). Activations are the model table's saved-for-backward bytes
(ddlbench.train.introspect), per sample × the samples in flight; fp32 throughout (bf16/fp16 autocast
keeps some activations in 16 bit: the prediction is then an upper bound, and says so).

**On CUDA** (a machine file with `cuda_memory`, fitted by a GPU calibration: benchmarks/gpu_analytic.py,
docs/analytic.md "On a GPU"; applied only when the machine's device is CUDA, so CPU predictions are
untouched) the measured figure is the caching allocator's `max_memory_allocated`, which counts more than
the tensors above (`with_cuda_terms`):
- allocator rounding: every block is a multiple of 512 B (CUDACachingAllocator's kMinBlockSize), so each
  parameter, gradient and momentum tensor (a layer's weight and bias) is counted rounded up. The 2 MiB
  (small-block) and 20 MiB segments it takes from the driver are its *reserved* memory, not counted here;
  a large block reused from its cache may be up to 1 MiB larger than asked (it is not split), which the
  fitted terms below absorb;
- workspaces alive from the first step to the end (`fixed_bytes`): cuBLAS/cuBLASLt keep one per handle
  and stream (32 MiB on Hopper by default), made through the caching allocator at the first matrix
  product, and the forward and the autograd engine's backward thread use different handles;
- the transient workspace of one call (`per_call_byte` × the largest convolution's or linear layer's
  operands: input and output at the micro-batch, plus its weights): cuDNN's and cuBLAS's scratch for
  the algorithm their heuristics choose, allocated and freed around the call. Taken as present at the
  peak, which makes it an upper bound of a workspace that comes late in the backward walk.
The two coefficients are fitted (`fit_cuda_terms`) to the measured peaks of a few calibration points (other
models and batches than those predicted), by non-negative least squares on relative residuals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

FP32 = 4
MOMENTUM_STATES = 1  # torch.optim.SGD(momentum=0.9): one buffer per parameter element
CUDA_BLOCK_BYTES = 512  # the CUDA caching allocator's smallest block: every block is a multiple of it
# layers whose calls take a library workspace (cuDNN convolutions, cuBLAS matrix products)
WORKSPACE_TYPES = ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose2d", "ConvTranspose3d", "Linear")


@dataclass(frozen=True, kw_only=True)
class RankMemory:
    """One rank's memory (bytes); every part is this rank's own (shards counted once)."""

    params_bytes: int
    grads_bytes: int  # the full set of gradients this rank keeps after a step
    optimizer_bytes: int
    buffers_bytes: int  # communication buffers (DDP buckets, fusion buffers, flat shards) + model buffers
    activations_bytes: int  # saved for backward at their most, all micro-batches in flight
    peak_bytes: int
    detail: str = ""
    device_bytes: int = 0  # CUDA only: workspaces alive between steps and allocator rounding (with_cuda_terms)

    @property
    def resident_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.buffers_bytes + self.device_bytes


def backward_peak(
    saved: Sequence[float], grads: Sequence[float], flowing: Sequence[float], *, in_flight: float = 1.0
) -> tuple[float, float]:
    """(peak of the step's transient memory, activations at their most), bytes, over the backward walk.

    saved[k]: activations block k keeps for one pass (its micro-batch); grads[k]: its gradients' bytes;
    flowing[k]: the gradient of its output (and input) while its backward runs. `in_flight` passes are
    kept alive at once (micro-batches of a pipeline), of which the oldest is being walked.
    """
    n = len(saved)
    activations = in_flight * sum(saved)
    peak = activations + (flowing[-1] if n else 0.0)
    produced = 0.0
    for k in range(n - 1, -1, -1):
        produced += grads[k]
        alive = (in_flight - 1) * sum(saved) + sum(saved[: k + 1])
        peak = max(peak, alive + produced + flowing[k])
    return peak, activations


@dataclass(frozen=True, kw_only=True)
class BucketMoments:
    """What buckets handed to an asynchronous collective hold for a while during a backward walk (bytes, per
    block): `held[k]` while block k's backward runs (collectives' temporaries alive then), `launch[k]` at the
    moment a bucket is launched at the end of block k's backward (its new buffer beside the gradients not yet
    copied into it, and the temporaries alive then), `passing[k]` the gradient flowing out of block k then
    (its input's), `after_walk` once the walk is over (temporaries not yet freed), `after_update` after the
    optimizer's step, every bucket buffer and activation gone (what the shards' all-gathers hold)."""

    held: Sequence[float]
    launch: Sequence[float]
    passing: Sequence[float]
    after_walk: float = 0.0
    after_update: float = 0.0


def bucketed_backward_peak(
    saved: Sequence[float],
    grads: Sequence[float],
    flowing: Sequence[float],
    launched: Sequence[float],
    moments: BucketMoments | None = None,
) -> tuple[float, float]:
    """backward_peak for gradients handed to buckets that stay alive to the end of backward (zero2 on
    gloo): launched[k] is what the buckets completed by block k's backward add on top of their
    gradients (their shards) from then on; `moments` what they hold for a while (BucketMoments): each
    block's walk, each launch, the end of the walk (every activation gone, every bucket held) and the
    all-gathers after the update are the candidates for the peak."""
    n = len(saved)
    moments = moments or BucketMoments(held=[0.0] * n, launch=[0.0] * n, passing=[0.0] * n)
    peak, produced, extra = 0.0, 0.0, 0.0
    for k in range(n - 1, -1, -1):
        produced += grads[k]
        peak = max(peak, sum(saved[: k + 1]) + produced + extra + flowing[k] + moments.held[k])
        if moments.launch[k]:  # block k's activations freed, its input's gradient flowing
            peak = max(peak, sum(saved[:k]) + produced + extra + moments.passing[k] + moments.launch[k])
        extra += launched[k]
    return max(peak, produced + extra + moments.after_walk, moments.after_update), float(sum(saved))


def rank_memory(
    *,
    params: float,
    grads: float,
    optimizer: float,
    buffers: float,
    saved: Sequence[float],
    grad_per_block: Sequence[float],
    flowing: Sequence[float],
    in_flight: float = 1.0,
    extra_peak: float = 0.0,
    launched: Sequence[float] | None = None,
    moments: BucketMoments | None = None,
    after_backward: float = 0.0,
    detail: str = "",
) -> RankMemory:
    """A rank's memory from its parts (bytes); extra_peak: a strategy's transient on top during the backward
    walk (gathered parameters, gradient buckets in flight); `launched`: buckets kept to the end of backward
    (bucketed_backward_peak), with their `moments`; `after_backward`: a transient
    made once the walk is over, beside every gradient but no activation (a flat copy of the gradients while
    they are reduced): the moment is a candidate for the peak of its own, never added to the walk's."""
    if launched is None:
        step_peak, activations = backward_peak(saved, grad_per_block, flowing, in_flight=in_flight)
    else:
        step_peak, activations = bucketed_backward_peak(saved, grad_per_block, flowing, launched, moments)
    # the walk's moment (with the strategy's transient on it) or, after it, every gradient and that copy
    transient = max(step_peak + extra_peak, float(sum(grad_per_block)) + after_backward if after_backward else 0.0)
    return RankMemory(
        params_bytes=int(params),
        grads_bytes=int(grads),
        optimizer_bytes=int(optimizer),
        buffers_bytes=int(buffers),
        activations_bytes=int(activations),
        peak_bytes=int(params + optimizer + buffers + transient),
        detail=detail,
    )


# CUDA: the caching allocator's counting (module docstring, "On CUDA") -----------------------------------


@dataclass(frozen=True, kw_only=True)
class CudaMemoryTerms:
    """A machine file's `cuda_memory`: what the caching allocator counts beyond the tensors (bytes)."""

    fixed_bytes: float  # workspaces alive from the first step on (cuBLAS/cuBLASLt, per handle and stream)
    per_call_byte: float  # transient workspace per byte of the largest conv/linear call's operands
    block_bytes: int = CUDA_BLOCK_BYTES  # every block a multiple of this

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> CudaMemoryTerms | None:
        if not data:
            return None
        return cls(
            fixed_bytes=float(data.get("fixed_bytes") or 0.0),
            per_call_byte=float(data.get("per_call_byte") or 0.0),
            block_bytes=int(data.get("block_bytes") or CUDA_BLOCK_BYTES),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"fixed_bytes": self.fixed_bytes, "per_call_byte": self.per_call_byte, "block_bytes": self.block_bytes}


def rounded(nbytes: float, block: int = CUDA_BLOCK_BYTES) -> int:
    """`nbytes` as a block of the caching allocator holds it: rounded up to a multiple of `block` (at least one)."""
    return max(1, math.ceil(nbytes / block)) * block


def parameter_rounding_bytes(table, block: int = CUDA_BLOCK_BYTES) -> int:
    """Bytes the allocator's rounding adds to one copy of the model's parameters (fp32): each layer's weight
    and its bias are separate tensors, each rounded up to a multiple of `block`. `table`: a ModelTable."""
    waste = 0
    for layer in table.layers:
        if not layer.params:
            continue
        weight = math.prod(layer.weight_shape) if layer.weight_shape else layer.params
        weight = min(weight, layer.params)
        for elements in (weight, layer.params - weight):
            if elements:
                waste += rounded(elements * FP32, block) - elements * FP32
    return waste


def largest_call_bytes(table, batch: float) -> float:
    """The largest operands of one convolution or linear layer call at `batch` samples (bytes, fp32): its
    input and output (× its calls' batch) plus its weights: what a library workspace scales with. 0 for a
    model without such layers. `table`: a ModelTable."""
    calls = [
        (math.prod(layer.input_shape) + math.prod(layer.output_shape)) * FP32 * batch + layer.params * FP32
        for layer in table.layers
        if layer.type in WORKSPACE_TYPES
    ]
    return float(max(calls, default=0.0))


def with_cuda_terms(memory: RankMemory, *, table, batch: float, terms: CudaMemoryTerms) -> RankMemory:
    """`memory` as CUDA's caching allocator counts it (module docstring, "On CUDA"): rounding of the rank's
    parameter, gradient and optimizer tensors, the fixed workspaces (resident from the first step on), and
    the largest call's transient workspace at micro-batch `batch` (at the peak only)."""
    whole = max(1, table.param_bytes)
    # copies of the parameters' tensors the rank holds: its parameters (their buffers aside), gradients and
    # momentum, as shares of the whole model (3 for ddp)
    copies = min(1.0, memory.params_bytes / whole) + (memory.grads_bytes + memory.optimizer_bytes) / whole
    rounding = parameter_rounding_bytes(table, terms.block_bytes) * copies
    call = largest_call_bytes(table, batch)
    transient = terms.per_call_byte * call
    resident = terms.fixed_bytes + rounding
    detail = (
        f"CUDA allocator: +{terms.fixed_bytes / 1e6:.3g} MB workspaces kept from the first step, "
        f"+{transient / 1e6:.3g} MB the largest call's workspace ({terms.per_call_byte:.3g} × "
        f"{call / 1e6:.3g} MB of operands), +{rounding / 1e3:.3g} kB rounding to {terms.block_bytes} B blocks"
    )
    return replace(
        memory,
        device_bytes=memory.device_bytes + int(resident),
        peak_bytes=int(memory.peak_bytes + resident + transient),
        detail=f"{memory.detail}; {detail}" if memory.detail else detail,
    )


def fit_cuda_terms(rows: Sequence[Mapping[str, Any]], *, block_bytes: int = CUDA_BLOCK_BYTES):
    """The CudaMemoryTerms that best explain measured peaks, and how well they do.

    Each row: `base_bytes` (the peak predicted with rounding but no workspaces), `call_bytes`
    (largest_call_bytes at its micro-batch), `measured_bytes` (its measured tensor peak), `group` (the
    model: rows of one model are left out together) and any other keys (kept). The excess measured −
    base is fitted as fixed_bytes + per_call_byte × call_bytes, both ≥ 0, by least squares on residuals
    relative to the measured peak. Returns (terms, rows with `fitted_bytes`, `accuracy` and
    `loo_accuracy`: the accuracy of the fit made without the row's model, None with a single model)."""
    import numpy as np

    from ddlbench.analysis.machine.fit import nnls

    rows = [dict(row) for row in rows if row.get("measured_bytes")]
    if not rows:
        return CudaMemoryTerms(fixed_bytes=0.0, per_call_byte=0.0, block_bytes=block_bytes), []

    def solve(chosen: list[dict[str, Any]]) -> tuple[float, float]:
        measured = np.array([float(r["measured_bytes"]) for r in chosen])
        x = np.array([[1.0, float(r["call_bytes"])] for r in chosen]) / measured[:, None]
        y = np.array([float(r["measured_bytes"]) - float(r["base_bytes"]) for r in chosen]) / measured
        scale = np.maximum(np.abs(x).max(axis=0), 1e-300)
        coefficients = nnls(x / scale, y) / scale
        return float(coefficients[0]), float(coefficients[1])

    def accuracy(predicted: float, measured: float) -> float:
        return 1.0 - abs(predicted - measured) / measured

    fixed, per_call = solve(rows)
    groups = list(dict.fromkeys(r.get("group") for r in rows))
    for row in rows:
        row["fitted_bytes"] = float(row["base_bytes"]) + fixed + per_call * float(row["call_bytes"])
        row["accuracy"] = accuracy(row["fitted_bytes"], float(row["measured_bytes"]))
        others = [r for r in rows if r.get("group") != row.get("group")]
        if len(groups) > 1 and others:
            f, c = solve(others)
            row["loo_accuracy"] = accuracy(
                float(row["base_bytes"]) + f + c * float(row["call_bytes"]), float(row["measured_bytes"])
            )
        else:
            row["loo_accuracy"] = None
    return CudaMemoryTerms(fixed_bytes=fixed, per_call_byte=per_call, block_bytes=block_bytes), rows
