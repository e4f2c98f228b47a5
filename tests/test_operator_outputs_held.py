"""The operator calibration keeps a forward's outputs as a network does (autograd saves them for the backward),
so each call writes its output where none was written just before; one output held at a time landed in the
block freed two calls before, still in the core's caches, and the forwards of a step's batch norms, ReLU6s
and small convolutions ran 1.3-1.5× what such timings fitted (docs/analytic.md)."""

from __future__ import annotations

import contextlib
import weakref

import torch

from ddlbench.train.calibration import operator_kernel
from ddlbench.train.calibration.kernels import Timer
from ddlbench.train.calibration.operator_shapes import OperatorShape


def test_a_cpu_forward_keeps_its_last_outputs_alive_up_to_the_ring(monkeypatch):
    alive: list[weakref.ref] = []
    most = [0]
    build = operator_kernel.build_operator

    def counting(*args):
        op, params = build(*args)

        def watched(x, other):
            y = op(x, other)
            alive.append(weakref.ref(y))
            most[0] = max(most[0], sum(ref() is not None for ref in alive))
            return y

        return watched, params

    monkeypatch.setattr(operator_kernel, "build_operator", counting)
    shape = OperatorShape(kind="relu", batch=2, in_channels=8, out_channels=8, height=16, width=16)
    output_bytes = 2 * 8 * 16 * 16 * 4  # 16 KiB: the ring would hold 2,048 of them, RING_MOST caps it
    ring = operator_kernel.outputs_held(torch.empty(output_bytes // 4), torch.device("cpu"))
    assert ring == operator_kernel.RING_MOST
    entry = operator_kernel.time_operator(
        shape, torch.device("cpu"), Timer(torch.device("cpu")), warmup=3, iterations=5, autocast=contextlib.nullcontext
    )
    assert entry["outputs_held"] == ring
    # every forward's output is still alive when the next is made: the first call's (before the timing), the
    # warm-up's, the timed ones', and those the backward's untimed forwards make, up to the ring
    calls = len(alive)
    assert calls >= 1 + 3 + 5 and most[0] == min(calls, ring)


def test_a_large_output_is_held_alone_and_a_gpu_keeps_one():
    large = torch.empty(operator_kernel.RING_BYTES // 4)  # one output fills the ring
    assert operator_kernel.outputs_held(large, torch.device("cpu")) == 1
    medium = torch.empty(operator_kernel.RING_BYTES // 4 // 16)
    assert operator_kernel.outputs_held(medium, torch.device("cpu")) == 16
    assert operator_kernel.outputs_held(medium, torch.device("cuda")) == 1
