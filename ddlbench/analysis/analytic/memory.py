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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FP32 = 4
MOMENTUM_STATES = 1  # torch.optim.SGD(momentum=0.9): one buffer per parameter element


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

    @property
    def resident_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.buffers_bytes


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


def bucketed_backward_peak(
    saved: Sequence[float], grads: Sequence[float], flowing: Sequence[float], launched: Sequence[float]
) -> tuple[float, float]:
    """backward_peak for gradients handed to buckets that stay alive to the end of backward (zero2 on
    gloo): launched[k] is what the buckets completed by block k's backward add on top of their
    gradients (their buffers, the collective's output, the shards) from then on. After the walk, every
    activation is gone and every bucket still held: that moment is a candidate for the peak too."""
    peak, produced, extra = 0.0, 0.0, 0.0
    for k in range(len(saved) - 1, -1, -1):
        produced += grads[k]
        peak = max(peak, sum(saved[: k + 1]) + produced + extra + flowing[k])
        extra += launched[k]
    return max(peak, produced + extra), float(sum(saved))


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
    detail: str = "",
) -> RankMemory:
    """A rank's memory from its parts (bytes); extra_peak: a strategy's transient on top (gathered
    parameters, gradient buckets in flight); `launched`: buckets kept to the end of backward
    (bucketed_backward_peak)."""
    if launched is None:
        step_peak, activations = backward_peak(saved, grad_per_block, flowing, in_flight=in_flight)
    else:
        step_peak, activations = bucketed_backward_peak(saved, grad_per_block, flowing, launched)
    return RankMemory(
        params_bytes=int(params),
        grads_bytes=int(grads),
        optimizer_bytes=int(optimizer),
        buffers_bytes=int(buffers),
        activations_bytes=int(activations),
        peak_bytes=int(params + optimizer + buffers + step_peak + extra_peak),
        detail=detail,
    )
