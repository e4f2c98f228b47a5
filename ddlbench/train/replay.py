"""The silent-data-corruption replay of one rank: the point's model trained alone, deterministically, on the
same samples as every other rank, with checksums of what it computed.

A GPU that corrupts data silently (Llama 3's training saw six such corruptions in 54 days on 16k H100s; a
clean `dcgmi diag -r 3` does not rule them out) computes a different number where its peers agree. Replays
of one computation on identical devices with deterministic kernels agree bit for bit (cuBLAS: "the same
bit-wise results at every run when executed on GPUs with the same architecture and the same number of SMs",
on one stream; cuDNN with `deterministic`), so any difference names a suspect. What each rank computes:

- the model of the point's seed (ddlbench.train.kernel.build_model: the same weights on every rank), trained
  alone with the point's optimizer, precision and layout, for `replay_steps` steps on samples
  [step × b, (step + 1) × b) of the point's dataset, b its per-rank batch: the same samples on every rank;
- under `torch.use_deterministic_algorithms(True, warn_only=True)`, cuDNN deterministic and not benchmarking:
  an operation without a deterministic implementation warns instead of failing, and is named in the result
  (`nondeterministic_ops`), since its run-to-run differences are then no evidence against the device;
- per step: the loss (as `float.hex`, exact) and the SHA-256 of every gradient's bytes, before the update;
  after the last step the SHA-256 of every weight's bytes; `digest`: the SHA-256 of all of these;
- twice, from a fresh model: `repeatable` says whether the two passes agree. A device that disagrees with
  itself is flaky (or ran a nondeterministic operation); one that agrees with itself but not with its peers
  computes something else, every time.

The check across ranks and nodes is ddlbench.certify.replay's. The `corrupt` fault (ddlbench.train.faults)
flips one bit of one weight before each pass's first step: a device with a stuck bit.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

from ddlbench.catalog import DATASETS
from ddlbench.point import Point
from ddlbench.train.execution import configure_execution, restored_execution_flags
from ddlbench.train.faults import flip_one_bit
from ddlbench.train.kernel import build_model, make_optimizer_for, open_point_data
from ddlbench.train.losses import loss_for

PASSES = 2
# cuBLAS takes this before it makes its handle (the worker sets it for a point with a replay, before CUDA
# starts: ddlbench.launch.worker); torch refuses deterministic cuBLAS calls without it
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


def replay_point(point: Point, device: torch.device, *, corrupt: bool = False) -> dict[str, Any]:
    """This rank's replay of `point` on `device` (see the module docstring): a JSON-able mapping."""
    began = time.perf_counter()
    passes, flipped, unsafe = [], "", set()
    with deterministic_kernels() as warned:
        for _ in range(PASSES):
            result, flipped = _one_pass(point, device, corrupt=corrupt)
            passes.append(result)
        unsafe.update(warned)
    first = passes[0]
    return {
        "steps": point.replay_steps,
        "samples_per_step": point.batch_size,
        "losses": first["losses"],
        "losses_hex": first["losses_hex"],
        "grad_sha256": first["grad_sha256"],
        "weights_sha256": first["weights_sha256"],
        "digest": first["digest"],
        "passes": PASSES,
        "repeatable": all(result["digest"] == first["digest"] for result in passes),
        "nondeterministic_ops": sorted(unsafe),
        "corrupted": flipped,  # what the injected `corrupt` fault flipped, "" without one
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG") if device.type == "cuda" else None,
        "seconds": time.perf_counter() - began,
    }


def _one_pass(point: Point, device: torch.device, *, corrupt: bool) -> tuple[dict[str, Any], str]:
    execution = configure_execution(point.precision, point.channels_last, False, device)
    with torch.device(device):
        model = build_model(point)
    execution.prepare_model(model)
    flipped = flip_one_bit(model) if corrupt else ""
    optimizer = make_optimizer_for(point)(model.parameters())
    loss_fn = loss_for(DATASETS.get(point.dataset).task)
    dataset = open_point_data(point)
    losses, grads, digest = [], [], hashlib.sha256()
    for step in range(point.replay_steps):
        inputs, targets = dataset.batch(step * point.batch_size, point.batch_size)
        inputs, targets = execution.prepare_inputs(inputs.to(device)), targets.to(device)
        optimizer.zero_grad(set_to_none=True)
        with execution.autocast():
            loss = loss_fn(model(inputs), targets)
        execution.backward(loss)
        grad = tensors_sha256(parameter.grad for parameter in model.parameters())
        execution.optimizer_step(optimizer)
        value = float(loss.detach().float().item())
        losses.append(value)
        grads.append(grad)
        digest.update(f"{value.hex()} {grad}\n".encode())
    weights = tensors_sha256(model.parameters())
    digest.update(weights.encode())
    result = {
        "losses": losses,
        "losses_hex": [value.hex() for value in losses],
        "grad_sha256": grads,
        "weights_sha256": weights,
        "digest": digest.hexdigest(),
    }
    return result, flipped


def tensors_sha256(tensors: Iterable[Tensor | None]) -> str:
    """SHA-256 of the tensors' bytes in order (a missing gradient counts as the word `none`): equal only
    for bit-equal tensors."""
    digest = hashlib.sha256()
    for tensor in tensors:
        if tensor is None:
            digest.update(b"none")
            continue
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(data.numpy().tobytes())
    return digest.hexdigest()


@contextlib.contextmanager
def deterministic_kernels() -> Iterator[set[str]]:
    """torch's deterministic algorithms (warn only), cuDNN deterministic and not benchmarking, restored after;
    yields the set it fills with the operations that warned of having no deterministic implementation."""
    warned: set[str] = set()
    was = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    with restored_execution_flags(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        try:
            yield warned
        finally:
            torch.use_deterministic_algorithms(was[0], warn_only=was[1])
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
            warned.update(_operation(str(item.message)) for item in caught if "deterministic" in str(item.message))


def _operation(message: str) -> str:
    """The operation a determinism warning names (its first word ending in `_cuda`/`_cpu` or the message's start)."""
    words = [word.strip("'\"`(),.") for word in message.split()]
    named = [word for word in words if word.endswith(("_cuda", "_cpu", "_kernel")) or "::" in word]
    return named[0] if named else message[:80]
