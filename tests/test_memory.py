"""Tensor memory peaks: the probe against hand counts, and what sharding saves, measured on real ranks."""

from __future__ import annotations

import pytest
import torch

from ddlbench.launch.runner import run_point
from ddlbench.train.memory import MemoryProbe, storage_bytes
from tests.conftest import make_point

MIB = 2**20


def probe_linear_steps(probe_step: int = 1) -> tuple[MemoryProbe, int]:
    """One 1024×1024 Linear (no bias) with SGD momentum, trained in this process under the probe."""
    torch.manual_seed(0)
    probe = MemoryProbe(torch.device("cpu"), enabled=True)
    probe.start()
    layer = torch.nn.Linear(1024, 1024, bias=False)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    inputs = torch.randn(8, 1024)
    pool = storage_bytes([inputs])
    for step in range(probe_step + 1):
        with probe.probing() if step == probe_step else _nothing():
            optimizer.zero_grad(set_to_none=True)
            layer(inputs).sum().backward()
            optimizer.step()
    return probe, pool


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_probe_equals_the_hand_count_of_one_linear_layer():
    probe, pool = probe_linear_steps()
    figures = probe.finish(pool)
    weight = 1024 * 1024 * 4
    activations = 8 * 1024 * 4  # the output, and its gradient
    # at the step's start: weight, its gradient from the last step, momentum; the input pool apart
    assert figures.resident_bytes == 3 * weight
    assert figures.input_pool_bytes == 8 * 1024 * 4
    # zero_grad(set_to_none) frees the old gradient before backward makes the new one: they never
    # coexist, so the peak is 3 weights plus the step's small tensors, not 4 (the old probe said 16 MiB)
    assert 3 * weight <= figures.peak_bytes <= 3 * weight + 2 * activations + 4096
    assert figures.peak_bytes < 13 * MIB


def test_a_second_probe_step_would_see_the_same_state():
    first, pool = probe_linear_steps(probe_step=1)
    first_figures = first.finish(pool)  # one profiler at a time
    later, _ = probe_linear_steps(probe_step=3)
    assert first_figures.resident_bytes == later.finish(pool).resident_bytes


def test_a_disabled_probe_starts_no_profiler():
    probe = MemoryProbe(torch.device("cpu"), enabled=False, why_not="not probed")
    probe.start()
    assert not torch.autograd._profiler_enabled()  # nothing slows the steps of a point without a probe
    figures = probe.finish(123)
    assert figures.peak_bytes is None and figures.resident_bytes is None and figures.input_pool_bytes == 123


def test_finishing_an_unprobed_run_still_stops_the_profiler():
    probe = MemoryProbe(torch.device("cpu"), enabled=True)
    probe.start()
    assert torch.autograd._profiler_enabled()
    figures = probe.finish(0)  # the probed step never ran (a rank failing in warm-up, say)
    assert not torch.autograd._profiler_enabled()  # the timed window must never run under it
    assert figures.peak_bytes is None


GPT = dict(model="gpt_tiny", dataset="tokens_small", model_options=(), batch_size=1, warmup_steps=2, steps=2)


def run_rank0(tmp_path, strategy, **fields):
    point = make_point(strategy=strategy, **(GPT | fields))
    record = run_point(point, out=tmp_path / strategy / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    return record.ranks[0]


def single_process_activations(tmp_path) -> int:
    """Peak minus resident of one process training the same model on the same local batch: what a step
    adds on top of the state (activations, their gradients, temporaries), measured apart."""
    rank = run_rank0(tmp_path, "ddp", nodes=1, ranks_per_node=1)
    return rank.tensor_peak_bytes - rank.tensor_resident_bytes


@pytest.mark.slow
def test_ddp_state_and_peak_match_the_hand_count(tmp_path):
    activations = single_process_activations(tmp_path)
    rank = run_rank0(tmp_path, "ddp", nodes=1, ranks_per_node=2)
    params = 4 * rank.facts["local_parameters"]
    buckets = sum(rank.facts["bucket_bytes"])
    state = 3 * params + buckets  # parameters + gradients + momentum + DDP's flat buckets
    assert rank.tensor_resident_bytes == pytest.approx(state, rel=0.02)
    assert rank.tensor_peak_bytes == pytest.approx(state + activations, rel=0.10)
    assert rank.input_pool_bytes > 0


@pytest.mark.slow
def test_sharding_saves_what_it_predicts(tmp_path):
    ddp, zero2, fsdp = (run_rank0(tmp_path, name, nodes=1, ranks_per_node=2) for name in ("ddp", "zero2", "fsdp"))
    params = 4 * ddp.facts["local_parameters"]
    # between steps (resident, measured): ddp P + G + M + buckets(= P) = 4P; zero2 (ZeRO-2) keeps full
    # parameters and half of gradients and momentum: 2P; fsdp (ZeRO-3) half of all three: 1.5P
    assert ddp.tensor_resident_bytes == pytest.approx(4 * params, rel=0.05)
    assert zero2.tensor_resident_bytes == pytest.approx(2 * params, rel=0.05)
    assert zero2.tensor_resident_bytes < ddp.tensor_resident_bytes
    # FSDP2's gather and reduce buffers are sometimes freed by gloo's worker thread, which the CPU probe
    # does not see (ddlbench.train.memory; a race, 1.5P to 2.1P seen over runs): never below the
    # prediction, always well below ddp; on CUDA the allocator's own counter has no such blind spot
    assert 1.5 * params * 0.98 <= fsdp.tensor_resident_bytes <= 2.5 * params
