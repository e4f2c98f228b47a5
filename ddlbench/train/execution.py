"""How one rank executes its steps: numeric precision, memory layout and compilation.

A point's `precision`, `channels_last` and `compile` become one `Execution` per rank, handed to the
strategy through `StrategySetup.execution`. Its step runs the forward pass and the loss under
`autocast()`, calls `backward(loss)` and `optimizer_step(optimizer)` instead of `loss.backward()` and
`optimizer.step()`, so the strategy never branches on the precision itself:

- fp32: strict float32. On CUDA TF32 is switched off for matmuls and convolutions
  (`torch.backends.cuda.matmul.allow_tf32 = False`, `torch.backends.cudnn.allow_tf32 = False`; cuDNN's
  default is on) and the float32 matmul precision is "highest".
- tf32: float32 tensors whose matmuls and convolutions run on TF32 tensor cores (10-bit mantissa), on
  CUDA devices of compute capability 8.0 or more only (https://pytorch.org/docs/stable/notes/cuda.html,
  "TensorFloat-32 (TF32) on Ampere (and later) devices").
- bf16, fp16: automatic mixed precision. `torch.autocast(device_type, dtype)` around the forward pass and
  the loss, never around backward; weights, gradients and optimizer state stay float32
  (https://pytorch.org/docs/stable/amp.html). fp16 adds a gradient scaler: the loss is multiplied by
  the scale before backward, gradients are unscaled before the optimizer step, and a step whose
  gradients hold an inf or NaN is skipped and the scale halved (torch.amp.GradScaler). Where ranks hold
  different gradients (shards, stages), one rank's overflow must skip the step on all, so with more than
  one rank the scaler all-reduces its found-inf flag over the world (ShardedGradScaler, torch's scaler
  for sharded gradients, which handles CPU tensors as well, taught to take DTensor and plain gradients
  together): a 4-byte all-reduce per step.

Device refusals happen here, at run time in the rank, as a DdlbenchError the record carries: tf32 on a
CPU or a pre-Ampere GPU, bf16 on a GPU without bf16. torch 2.13's CPU autocast does run bf16 and fp16
(conv and linear compute in the lower dtype) and its GradScaler runs on the CPU, so both are accepted
on the CPU. Strategies that cannot honour an option are refused at plan time instead
(`StrategySpec.refuses`, ddlbench.validity).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ddlbench.errors import DdlbenchError
from ddlbench.point import PRECISIONS
from ddlbench.train import recording

AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
TF32_MIN_CAPABILITY = (8, 0)  # Ampere


@dataclass(kw_only=True)
class Execution:
    """One rank's precision, layout and compilation, applied by the strategy's step.

    The default is strict fp32 on the CPU, eager and contiguous: what a strategy built without a point
    (a unit test) runs. Build it for a run with `configure_execution`, which also sets torch's global
    TF32 switches and refuses what the device cannot do.
    """

    precision: str = "fp32"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    channels_last: bool = False
    compile: bool = False
    scaler: torch.amp.GradScaler | None = None  # fp16 only
    compiled: list[str] = field(default_factory=list)  # what compile() compiled, in order
    optimizer_steps: int = 0
    skipped_steps: int = 0  # optimizer steps the scaler skipped for inf/NaN gradients

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise DdlbenchError(f"precision {self.precision!r} unknown; accepted: {', '.join(PRECISIONS)}")

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return AUTOCAST_DTYPES.get(self.precision)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context for the forward pass and the loss (not backward, as torch's AMP docs ask); the
        rank's recorder counts it as the forward phase (ddlbench.train.recording)."""
        dtype = self.autocast_dtype
        if dtype is None:
            return recording.phase("forward")
        stack = contextlib.ExitStack()
        stack.enter_context(recording.phase("forward"))
        stack.enter_context(torch.autocast(self.device.type, dtype=dtype))
        return stack

    def boundary_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a floating activation has when it crosses from one rank's stage to the next:
        under autocast the autocast dtype (half the bytes on the wire, as Megatron-LM's bf16 pipelines
        send), since what a block outputs under autocast depends on its last op; else its own dtype."""
        autocast = self.autocast_dtype
        return autocast if autocast is not None and dtype.is_floating_point else dtype

    def to_boundary(self, x: Tensor) -> Tensor:
        return x.to(self.boundary_dtype(x.dtype))

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """The model in the point's memory format (in place): NHWC weights for channels_last."""
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        return model

    def prepare_inputs(self, x: Tensor) -> Tensor:
        """A batch in the point's memory format; free when it already is (the kernel converts its pool)."""
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def compile_module(self, module: nn.Module, name: str = "model") -> nn.Module:
        """`module.compile()` in place when the point asks for it: names and state dict stay those of the
        eager module. Compilation itself happens at the first call, i.e. in the first warm-up step."""
        if self.compile:
            module.compile()
            self.compiled.append(name)
        return module

    def backward(self, loss: Tensor, gradient: Tensor | None = None) -> None:
        """Backward from the loss, scaled first under fp16 (or from an output and the gradient a later
        pipeline stage sent for it, already scaled); the recorder's backward phase."""
        with recording.phase("backward"):
            if gradient is not None:
                loss.backward(gradient)
            else:
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def schedule_loss(self, loss_fn: Callable[[Tensor, Tensor], Tensor]) -> ScheduledLoss:
        """A loss function for schedules that run backward themselves (torch.distributed.pipelining)."""
        return ScheduledLoss(loss_fn, self)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step; under fp16 unscaled, skipped on overflow (on every rank alike) and the scale updated."""
        with recording.phase("update"):
            self._optimizer_step(optimizer)

    def _optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer_steps += 1
        if self.scaler is None:
            optimizer.step()
            return
        # GradScaler.step already reads its found-inf flag on the host (an .item()), so reading the scale
        # around update() adds no synchronisation a CUDA step did not already have
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        if self.scaler.get_scale() < before:  # update() backs the scale off only after an inf/NaN
            self.skipped_steps += 1

    def facts(self, model: nn.Module | None = None) -> dict[str, Any]:
        """What was really in effect, read back from torch: for the record (RankResult.execution)."""
        facts: dict[str, Any] = {
            "precision": self.precision,
            "autocast_dtype": str(self.autocast_dtype).removeprefix("torch.") if self.autocast_dtype else None,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "compiled": list(self.compiled),
            "optimizer_steps": self.optimizer_steps,
        }
        if self.device.type == "cuda":
            facts["cuda_matmul_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
            facts["cudnn_allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
        if model is not None:
            facts["weight_memory_format"] = first_conv_memory_format(model)
        if self.scaler is not None:
            facts["grad_scaler"] = {
                "final_scale": self.scaler.get_scale(),
                "skipped_steps": self.skipped_steps,
                "agrees_over": "world" if _is_sharded(self.scaler) else "rank",
            }
        return facts


class ScheduledLoss:
    """A schedule's loss function: the loss under autocast, returned scaled under fp16 for the schedule's
    own backward, and kept unscaled (detached) for the record."""

    def __init__(self, loss_fn: Callable[[Tensor, Tensor], Tensor], execution: Execution) -> None:
        self.loss_fn, self.execution = loss_fn, execution
        self.losses: list[Tensor] = []

    def __call__(self, output: Tensor, target: Tensor) -> Tensor:
        with self.execution.autocast():
            loss = self.loss_fn(output, target)
        self.losses.append(loss.detach())
        scaler = self.execution.scaler
        return scaler.scale(loss) if scaler is not None else loss

    def take(self) -> list[Tensor]:
        """The unscaled losses since the last call."""
        losses, self.losses = self.losses, []
        return losses


def configure_execution(precision: str, channels_last: bool, compile: bool, device: torch.device) -> Execution:
    """The Execution of a run on `device`: refuses what the device cannot do and sets torch's TF32
    switches (process-wide; one point per rank process)."""
    execution = Execution(precision=precision, device=device, channels_last=channels_last, compile=compile)
    on_cuda = device.type == "cuda"
    if precision == "tf32":
        if not on_cuda:
            raise DdlbenchError(
                f"precision 'tf32' needs a CUDA GPU of compute capability >= 8.0 (Ampere); this rank runs on "
                f"{device.type}, where float32 has no TF32 mode; accepted here: fp32, bf16, fp16"
            )
        capability = torch.cuda.get_device_capability(device)
        if capability < TF32_MIN_CAPABILITY:
            raise DdlbenchError(
                f"precision 'tf32' needs compute capability >= 8.0 (Ampere); {torch.cuda.get_device_name(device)} "
                f"has {capability[0]}.{capability[1]}; accepted here: fp32, fp16"
            )
    if precision == "bf16" and on_cuda and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise DdlbenchError(
            f"precision 'bf16' needs a GPU with bfloat16 arithmetic; {torch.cuda.get_device_name(device)} has "
            "none; accepted here: fp32, fp16"
        )
    if precision == "fp16" and not torch.amp.autocast_mode.is_autocast_available(device.type):
        raise DdlbenchError(f"precision 'fp16' needs autocast on {device.type}, which this torch lacks")
    tf32 = precision == "tf32"
    # every precision sets both switches, so a point never inherits another's (fp32 is strict)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    if precision == "fp16":
        execution.scaler = build_grad_scaler(device)
    return execution


def build_grad_scaler(device: torch.device) -> torch.amp.GradScaler:
    """fp16's scaler; with several ranks it agrees on overflow over the world (see the module docstring)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        scaler: torch.amp.GradScaler = _world_grad_scaler_class()(device.type, process_group=dist.group.WORLD)
    else:
        scaler = torch.amp.GradScaler(device.type)
    # the scale is created lazily by the first scale(); a pipeline rank without the loss never calls it,
    # yet unscales the (scaled) gradients it receives, so create it on every rank now
    scaler.scale(torch.zeros((), device=device))
    return scaler


def first_conv_memory_format(model: nn.Module) -> str | None:
    """The layout of the first 2-D convolution's weight this rank holds: "channels_last", "contiguous",
    "either" (a layout both describe) or "other"; None without one.

    A 2-D convolution's weight is the only 4-D `weight` of our models, which also finds the convolutions
    a strategy has replaced by its own modules (ParaDL's split layers hold a slice of the weight)."""
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is None:
            continue
        local = weight.to_local() if hasattr(weight, "to_local") else weight
        if local.is_meta or local.dim() != 4:
            continue  # not a 2-D convolution, or a block another rank holds (pipelines release theirs to meta)
        nhwc, nchw = local.is_contiguous(memory_format=torch.channels_last), local.is_contiguous()
        # a 1×1 kernel over one input channel is laid out alike both ways
        return {(True, False): "channels_last", (False, True): "contiguous", (True, True): "either"}.get(
            (nhwc, nchw), "other"
        )
    return None


def _is_sharded(scaler: torch.amp.GradScaler) -> bool:
    return type(scaler).__name__ == "WorldGradScaler"


@functools.cache
def _world_grad_scaler_class() -> type[torch.amp.GradScaler]:
    """ShardedGradScaler that also takes a mix of DTensor and plain gradients (built on first use: it
    needs torch.distributed).

    Tensor parallelism leaves the layers it does not split (embeddings, norms, the head) plain tensors
    beside the DTensor shards, and torch's scaler unscales all gradients of one device and dtype in one
    `_amp_foreach_non_finite_check_and_unscale_`, which refuses mixed DTensor and Tensor arguments. So
    each kind is unscaled in its own call, into the same found-inf flag; the per-device flags of the two
    calls are summed (the scaler only asks whether their sum is nonzero). `_unscale_grads_` is private,
    with the same signature from torch 2.6 to 2.13 (checked; the floor is 2.10)."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from torch.distributed.tensor import DTensor

    class WorldGradScaler(ShardedGradScaler):
        def _unscale_grads_(
            self, optimizer: torch.optim.Optimizer, inv_scale: Tensor, found_inf: Tensor, allow_fp16: bool = True
        ) -> dict[torch.device, Tensor]:
            kinds: dict[bool, list[Tensor]] = {}
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        kinds.setdefault(isinstance(param.grad, DTensor), []).append(param)
            if len(kinds) < 2:
                return super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
            found: dict[torch.device, Tensor] = {}
            for params in kinds.values():
                part = SimpleNamespace(param_groups=[{"params": params}])  # all the method reads
                for device, flag in super()._unscale_grads_(part, inv_scale, found_inf, allow_fp16).items():
                    found[device] = found[device] + flag if device in found else flag
            return found

    return WorldGradScaler


@contextlib.contextmanager
def restored_execution_flags() -> Iterator[None]:
    """Restore torch's TF32 switches on exit (tests that configure several executions in one process)."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[0], saved[1]
        torch.set_float32_matmul_precision(saved[2])
