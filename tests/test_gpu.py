"""GPU path: NCCL and the CUDA allocator's figures, for every strategy. Skipped cleanly without CUDA
(and, per case, without enough GPUs: NCCL refuses two ranks on one device)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from ddlbench.catalog import STRATEGIES
from ddlbench.launch.runner import run_point
from tests.conftest import make_point
from tests.equivalence import layout_point

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# strategy -> (model, dataset, ranks, extra point fields): the smallest point that exercises it
GPU_CASES = {
    "ddp": ("resnet18", "cifar10", 2, {}),
    "horovod": ("resnet18", "cifar10", 2, {}),
    "model_parallel": ("resnet18", "cifar10", 2, {}),
    "gpipe": ("resnet18", "cifar10", 2, {"micro_batches": 4}),
    "1f1b": ("resnet18", "cifar10", 2, {"micro_batches": 4}),
    "interleaved_1f1b": ("resnet18", "cifar10", 2, {"micro_batches": 4}),
    "fsdp": ("resnet18", "cifar10", 2, {}),
    "zero2": ("resnet18", "cifar10", 2, {}),
    "tensor": ("gpt_tiny", "tokens_small", 2, {}),
    "filter": ("resnet18", "cifar10", 2, {}),
    "channel": ("resnet18", "cifar10", 2, {}),
    "spatial": ("resnet18", "cifar10", 2, {}),
    "dp_pp": ("resnet18", "cifar10", 4, {"micro_batches": 4, "split": 2}),
    "dp_tp": ("gpt_tiny", "tokens_small", 4, {"split": 2}),
    "dp_spatial": ("resnet18", "cifar10", 4, {"split": 2}),
    "dp_filter": ("resnet18", "cifar10", 4, {"split": 2}),
}


def test_every_strategy_has_a_gpu_case():
    assert set(GPU_CASES) == set(STRATEGIES.names())


def test_point_on_cuda_uses_nccl_and_records_allocator_peaks(tmp_path):
    ranks = min(torch.cuda.device_count(), 2)
    point = make_point(ranks_per_node=ranks, batch_size=64, warmup_steps=2, steps=6)
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    assert record.provenance.backend == "nccl"
    assert record.provenance.gpu_model
    metrics = record.metrics
    assert metrics.cuda_peak_allocated_bytes > 0
    assert metrics.cuda_peak_reserved_bytes >= metrics.cuda_peak_allocated_bytes
    # steps timed by CUDA events on one clock; memory by the allocator's counters, the input pool apart
    assert all(rank.timer == "cuda_events" for rank in record.ranks)
    assert metrics.input_pool_bytes > 0
    assert 0 < metrics.tensor_resident_bytes < metrics.tensor_peak_bytes
    assert metrics.tensor_peak_bytes + metrics.input_pool_bytes <= metrics.cuda_peak_allocated_bytes
    # phases stamped by events on the stream, in the traced steps only (the last one here); collectives
    # not traced on CUDA, and said so; back-to-back steps share their boundary event
    for rank in record.ranks:
        assert rank.anatomy_steps == (point.steps - 1,) and len(rank.anatomy["step_s"]) == 1
        assert rank.step_starts_s[1:] == rank.step_ends_s[:-1]
        assert "CUDA events" in rank.anatomy_note
        assert min(rank.anatomy["forward_s"]) > 0 and min(rank.anatomy["backward_s"]) > 0
        assert max(rank.anatomy["comm_ops"]) == 0
        parts = ("forward_s", "backward_s", "update_s", "other_s")
        for i, step in enumerate(rank.anatomy["step_s"]):
            assert sum(rank.anatomy[name][i] for name in parts) == pytest.approx(step, rel=1e-6)


@pytest.mark.parametrize("strategy", sorted(GPU_CASES))
def test_strategy_runs_with_nccl_on_cuda(tmp_path, strategy):
    model, dataset, ranks, extra = GPU_CASES[strategy]
    if torch.cuda.device_count() < ranks:
        pytest.skip(f"{strategy} needs {ranks} GPUs; this host has {torch.cuda.device_count()}")
    point = layout_point(model=model, dataset=dataset, strategy=strategy, ranks_per_node=ranks, batch_size=16, **extra)
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    failures = "; ".join(f"{f.error_type}: {f.message}" for f in record.failures)
    if strategy == "horovod" and "make horovod" in (record.reason or "") + failures:
        pytest.skip("horovod is not built on this host")
    assert record.status == "ok", f"{record.reason} {failures}"
    assert record.provenance.backend == "nccl"
    assert record.metrics.cuda_peak_allocated_bytes > 0
    assert math.isfinite(record.metrics.loss_last)


# strategy -> (model, dataset, ranks, extra point fields) for the comparison with one process: models whose
# norms see one sample at a time (GroupNorm, LayerNorm), so the reference trains the whole global batch at once
EQUIVALENCE_CASES = {
    name: (("gpt_tiny", "tokens_small", ranks, extra) if model == "gpt_tiny" else ("resnet8", "cifar10", ranks, extra))
    for name, (model, _, ranks, extra) in GPU_CASES.items()
}


# Strategies whose ranks convolve other shapes than the single process does (a slab of the image and its
# halo): cuDNN then picks other algorithms on each side, and on an H200 (2026-11-28) spatial and dp_spatial
# ended 15-30x the summation-order bound from their reference (max |delta| 1e-4 after 3 steps) while every
# strategy convolving whole images stayed within it. With cuDNN off on both sides (ATen's own CUDA
# convolutions) both matched. Their equivalence is checked so; cuDNN's own accuracy is not this test's.
WITHOUT_CUDNN = frozenset({"spatial", "dp_spatial"})


@pytest.mark.parametrize("strategy", sorted(EQUIVALENCE_CASES))
def test_strategy_on_cuda_matches_its_single_process_reference(tmp_path, monkeypatch, strategy):
    """Every strategy's CUDA path against one process training on the same GPU. With fewer GPUs than ranks
    the ranks share them (share_gpus: gloo, point-to-point through host copies, ddlbench.train.shared_gpu);
    with enough, one GPU each over NCCL. Strict fp32 on both sides (TF32 off), so that rounding alone
    separates them (tests/equivalence.py's bound)."""
    from tests.equivalence import assert_within_rounding, parameter_names, rounding_bound, run_for_real
    from tests.reference import train_reference

    model, dataset, ranks, extra = EQUIVALENCE_CASES[strategy]
    shared = torch.cuda.device_count() < ranks
    options = () if model == "gpt_tiny" else (("norm", "group"),)
    point = layout_point(
        model=model,
        dataset=dataset,
        strategy=strategy,
        ranks_per_node=ranks,
        batch_size=8,
        warmup_steps=1,
        steps=2,
        model_options=options,
        share_gpus=shared,
        **extra,
    )
    cudnn = strategy not in WITHOUT_CUDNN
    if not cudnn:  # the ranks start with cuDNN off (tests/gpu_without_cudnn/sitecustomize.py)
        path = [str(Path(__file__).parent / "gpu_without_cudnn"), os.environ.get("PYTHONPATH", "")]
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(part for part in path if part))
    try:
        record = run_for_real(tmp_path, point)
    except AssertionError as error:
        if strategy == "horovod" and "make horovod" in str(error):
            pytest.skip("horovod is not built on this host")
        raise
    assert record.provenance.backend == ("gloo" if shared else "nccl")
    uuids = {rank.gpu.get("uuid") for rank in record.ranks}
    assert len(uuids) == (1 if shared else ranks) and None not in uuids
    got = torch.load(tmp_path / "params.pt", map_location="cpu")
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    enabled, torch.backends.cudnn.enabled = torch.backends.cudnn.enabled, cudnn
    try:
        want, losses = train_reference(point, device=torch.device("cuda", 0))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cudnn.enabled = enabled
    from ddlbench.train.kernel import build_model

    reference = build_model(point)
    names = parameter_names(reference)
    bound = rounding_bound(point, reference)
    worst = assert_within_rounding(got, {n: want[n] for n in names}, reference.state_dict(), bound, label=strategy)
    print(f"{strategy}: {'shared GPU, gloo' if shared else 'NCCL'}; worst error/bound {worst:.3g}")
    assert abs(record.metrics.loss_last - losses[-1]) <= bound.loss_tolerance(losses[-1])


def test_a_rank_takes_its_local_rank_gpu_and_records_what_it_is(tmp_path):
    from ddlbench.launch.devices import gpu_identity, rank_device

    device, backend = rank_device(0, 1, {})
    assert (device, backend) == (torch.device("cuda", 0), "nccl")
    identity = gpu_identity(device, {"CUDA_VISIBLE_DEVICES": "0"})
    assert identity["index"] == 0 and identity["name"] == torch.cuda.get_device_name(0)
    assert identity["uuid"].startswith("GPU-") and len(identity["pci_bus_id"]) == len("00000000:00:00.0")
    with pytest.raises(Exception, match=r"ranks on this host need one GPU each, but \d+ are visible"):
        rank_device(0, torch.cuda.device_count() + 1, {"CUDA_VISIBLE_DEVICES": "0"})
    record = run_point(make_point(), out=tmp_path / "r.json", launcher="local")
    assert record.status == "ok", record.reason
    assert record.ranks[0].gpu["index"] == 0 and record.ranks[0].gpu["uuid"] == identity["uuid"]


def test_a_rank_slurm_bound_to_one_gpu_takes_cuda_0_whichever_gpu_it_is(tmp_path):
    """As an srun step with --gpus-per-task=1 --gpu-bind=… leaves it: one GPU visible (the host's last),
    the binding said; local rank 1 of 2 trains on cuda:0, which is that GPU."""
    import subprocess
    import sys

    from ddlbench.launch.placement import GPU_BIND_VAR

    last = torch.cuda.device_count() - 1
    probe = (
        "import os, torch; from ddlbench.launch.devices import rank_device, gpu_identity; "
        "d, b = rank_device(1, 2, os.environ); print(d, b, gpu_identity(d, os.environ)['uuid'])"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(last), GPU_BIND_VAR: "single:1"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    device, backend, uuid = out.stdout.split()
    assert (device, backend) == ("cuda:0", "nccl")
    assert uuid == f"GPU-{torch.cuda.get_device_properties(last).uuid}"


def test_a_rank_records_its_gpus_numa_node_its_cpus_and_the_network_variables(tmp_path, monkeypatch):
    from ddlbench.launch.placement import LAUNCH_VAR

    network = '{"gpu_bind":"single:1","gpus_per_rank":0,"network_env":{"NCCL_DEBUG":"WARN"}}'
    monkeypatch.setenv(LAUNCH_VAR, network)
    record = run_point(make_point(threads=2), out=tmp_path / "r.json", launcher="local")
    assert record.status == "ok", record.reason
    (rank,) = record.ranks
    gpu = rank.gpu
    assert {"uuid", "pci_bus_id", "numa_node", "local_cpus", "cpu_alignment", "shared_with"} <= set(gpu), gpu
    assert gpu["shared_with"] == [] and rank.network_env == {"NCCL_DEBUG": "WARN"}
    print(f"numa_node {gpu['numa_node']}, local_cpus {gpu['local_cpus']}, cpus {rank.cpus}: {gpu['cpu_alignment']}")
    if gpu["numa_node"] is None:  # -1 (a VM, say): no NUMA information, nothing moved
        assert "no NUMA information" in gpu["cpu_alignment"]
    elif gpu["cpu_alignment"].startswith(("restricted", "already")):
        assert set(rank.cpus) <= set(gpu["local_cpus"])


def test_two_ranks_on_one_gpu_are_refused_unless_the_point_shares_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    refused = run_point(make_point(ranks_per_node=2), out=tmp_path / "no" / "r.json", launcher="local")
    said = " ".join([refused.reason or "", *(failure.message for failure in refused.failures)])
    assert refused.status == "failed" and "need one GPU each, but 1 are visible" in said, said
    assert "CUDA_VISIBLE_DEVICES='0'" in said and "`share_gpus: true`" in said
    shared = run_point(make_point(ranks_per_node=2, share_gpus=True), out=tmp_path / "yes" / "r.json", launcher="local")
    assert shared.status == "ok", shared.reason
    assert shared.provenance.backend == "gloo"
    assert len({rank.gpu["uuid"] for rank in shared.ranks}) == 1
    assert sorted(rank.gpu["shared_with"] for rank in shared.ranks) == [[0], [1]]


def test_points_in_one_cuda_launch_measure_as_they_would_alone(tmp_path):
    """A group launch (the adaptive sweep's) on CUDA: the second point starts after the first in the same
    processes and the same device, yet its allocator peak and its losses are those of the point alone —
    nothing of the first point stays on the device, and the peaks are reset between points."""
    from ddlbench.launch.group import run_group

    big, small = (make_point(batch_size=b, warmup_steps=2, steps=4) for b in (128, 64))
    outs = [tmp_path / "group" / name / "record.json" for name in ("big", "small")]
    launch = run_group([big, small], outs=outs, launch_out=tmp_path / "launch.json", launch_id="g", launcher="local")
    assert [span.status for span in launch.points] == ["ok", "ok"] and not any(s.alone for s in launch.points)
    alone = run_point(small, out=tmp_path / "alone" / "record.json", launcher="local")
    from ddlbench.records import read_record

    grouped = read_record(outs[1])
    assert alone.status == "ok" and grouped.ranks[0].timer == "cuda_events"
    assert grouped.metrics.cuda_peak_allocated_bytes == pytest.approx(alone.metrics.cuda_peak_allocated_bytes, rel=0.02)
    assert grouped.metrics.tensor_peak_bytes == pytest.approx(alone.metrics.tensor_peak_bytes, rel=0.02)
    assert grouped.ranks[0].losses == pytest.approx(alone.ranks[0].losses, rel=1e-3)


def test_the_replay_on_cuda_is_bit_repeatable_and_finds_a_flipped_bit(monkeypatch):
    """The silent-data-corruption replay (ddlbench.train.replay) on this GPU: its two passes and a second call
    agree bit for bit with deterministic kernels, and a flipped bit shows from the first step's loss."""
    from ddlbench.train.replay import CUBLAS_WORKSPACE_CONFIG, replay_point

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    point = make_point(replay_steps=3, batch_size=32)
    device = torch.device("cuda", 0)
    first, second = replay_point(point, device), replay_point(point, device)
    corrupt = replay_point(point, device, corrupt=True)
    print(f"replay on {torch.cuda.get_device_name(device)}: {first['seconds']:.2f} s, "
          f"nondeterministic ops: {first['nondeterministic_ops']}")  # fmt: skip
    assert first["repeatable"] and first["digest"] == second["digest"], (first, second)
    assert corrupt["repeatable"] and corrupt["losses_hex"][0] != first["losses_hex"][0]
