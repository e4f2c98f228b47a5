"""Tensor memory peaks: the probe against hand counts, its window (one step, the same on CPU and CUDA), its
start-up check and what a broken probe leaves in a record, and what sharding saves, measured on real ranks."""

from __future__ import annotations

import ctypes
import json
import os
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddlbench.launch.runner import run_point
from ddlbench.train import memory
from ddlbench.train.memory import MemoryProbe, loaded_libc10, process_wide_accounting, storage_bytes
from tests.conftest import leave_spawned_rank, make_point

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
    assert torch.autograd._profiler_enabled() and process_wide_accounting().value
    figures = probe.finish(0)  # the probed step never ran (a rank failing in warm-up, say)
    assert not torch.autograd._profiler_enabled()  # the timed window must never run under it
    assert not process_wide_accounting().value  # nor under the allocator's lock on every block
    assert figures.peak_bytes is None


def test_the_profiler_stops_only_after_other_threads_had_the_settle_time(monkeypatch):
    """A collective's worker thread frees the step's last buffers just after the step: the profiler stops only
    SETTLE_S after the probed step ends, and the figures stay those of the step."""
    events: list[str] = []
    sleep, stop = memory.time.sleep, MemoryProbe._stop
    monkeypatch.setattr(memory.time, "sleep", lambda seconds: (events.append(f"sleep {seconds}"), sleep(seconds)))
    monkeypatch.setattr(MemoryProbe, "_stop", lambda self: (events.append("stop"), stop(self))[1])
    probe, pool = probe_linear_steps()
    events.append("step ended")
    figures = probe.finish(pool)
    assert events[events.index("step ended") :] == ["step ended", f"sleep {memory.SETTLE_S}", "stop"]
    assert figures.resident_bytes == 3 * 1024 * 1024 * 4 and not torch.autograd._profiler_enabled()


def _report_the_flag(queue) -> None:
    queue.put(process_wide_accounting().value)


def test_a_forked_loader_worker_starts_without_the_accounting():
    probe = MemoryProbe(torch.device("cpu"), enabled=True)
    probe.start()
    try:
        fork = mp.get_context("fork")
        queue = fork.SimpleQueue()
        child = fork.Process(target=_report_the_flag, args=(queue,))
        child.start()
        child.join(timeout=60)
        assert queue.get() is False and process_wide_accounting().value
    finally:
        probe.finish(0)


# Gloo's reduce-scatter clones its input on the rank's thread, and the clone dies with the work, which
# gloo's worker thread drops last in about one call of ten here: a probe that saw only the rank thread's
# frees counted such clones as live (2 to 7 of 300 here). Many calls make the race show on any machine.
COLLECTIVE_CALLS = 300
COLLECTIVE_ELEMENTS = 2**14  # input elements per call: a 64 KiB block, well above gloo's small tensors


def _collective_rank(rank: int, folder: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        probe = MemoryProbe(torch.device("cpu"), enabled=True)
        probe.start()
        for _ in range(COLLECTIVE_CALLS):
            full, shard = torch.ones(COLLECTIVE_ELEMENTS), torch.empty(COLLECTIVE_ELEMENTS // 2)
            dist.reduce_scatter_tensor(shard, full, async_op=True).wait()
        del full, shard  # the last clone may still be gloo's: the probe lets it go before reading resident
        kept = torch.ones(COLLECTIVE_ELEMENTS // 2)  # live across the probed step: resident
        with probe.probing():
            full, shard = torch.ones(COLLECTIVE_ELEMENTS), torch.empty(COLLECTIVE_ELEMENTS // 2)
            dist.reduce_scatter_tensor(shard, full, async_op=True).wait()
            del full, shard
        figures = probe.finish(0)
        (Path(folder) / f"rank{rank}.json").write_text(
            json.dumps({"resident": figures.resident_bytes, "peak": figures.peak_bytes, "kept": kept.nbytes})
        )
    finally:
        dist.destroy_process_group()
    leave_spawned_rank()  # only once the results are written: an error above still fails the rank


@pytest.mark.slow
def test_collective_buffers_freed_on_gloos_thread_are_freed_in_the_figures(tmp_path):
    mp.spawn(_collective_rank, args=(str(tmp_path),), nprocs=2, join=True)
    block = 4 * COLLECTIVE_ELEMENTS
    for rank in range(2):
        figures = json.loads((tmp_path / f"rank{rank}.json").read_text())
        # before the probed step only `kept` is alive: none of the 300 clones, whichever thread freed them
        assert figures["resident"] == figures["kept"]
        # during it: the input, the output and gloo's clone of the input, all live at once
        assert figures["peak"] == figures["resident"] + block + block // 2 + block


def test_blocks_of_other_threads_count_where_they_are_made_and_freed():
    """A block made on the rank's thread and freed on another, and one made on another thread and kept:
    what gloo's and Horovod's threads do, without them."""
    probe = MemoryProbe(torch.device("cpu"), enabled=True)
    probe.start()
    handed = [torch.ones(MIB // 4)]  # 1 MiB, made here
    kept: list[torch.Tensor] = []

    def elsewhere() -> None:
        handed.clear()  # its last reference: freed on this thread
        kept.append(torch.ones(MIB // 2))  # 2 MiB, made on this thread, still alive at the step

    worker = threading.Thread(target=elsewhere)
    worker.start()
    worker.join()
    with probe.probing():
        during = torch.ones(MIB // 8)  # 512 KiB, during the step
        del during
    figures = probe.finish(0)
    assert figures.resident_bytes == 2 * MIB
    assert figures.peak_bytes == 2 * MIB + MIB // 2
    assert kept[0].nbytes == 2 * MIB


def test_the_window_is_the_probed_step_not_the_steps_before_it():
    """A block made and freed before the probed step (bigger than anything after it: a first step's
    buffers) is not in the peak; one made before it and still alive is, in resident and peak alike."""
    probe = MemoryProbe(torch.device("cpu"), enabled=True)
    probe.start()
    earlier = torch.ones(4 * MIB)  # 16 MiB, freed before the probed step
    del earlier
    kept = torch.ones(MIB // 4)  # 1 MiB, alive across the probed step
    with probe.probing():
        during = torch.ones(MIB // 2)  # 2 MiB, made and freed inside it
        del during
    figures = probe.finish(0)
    assert figures.resident_bytes == kept.nbytes
    assert figures.peak_bytes == kept.nbytes + 2 * MIB


def test_the_flag_is_c10s_own_in_this_process():
    # the libc10 that `import torch` mapped, the only one, and its flag counts a helper thread's block
    assert len(loaded_libc10()) == 1
    probe = MemoryProbe(torch.device("cpu"), enabled=True)
    probe.start()
    try:
        assert probe.enabled, probe.why_not
    finally:
        probe.finish(0)


def test_the_libc10_of_the_process_is_read_from_its_maps(tmp_path):
    maps = tmp_path / "maps"
    lib = "/venv/site-packages/torch/lib"
    maps.write_text(
        f"7f00-7f01 r--p 00000000 fe:00 11 {lib}/libc10_cuda.so\n"
        f"7f01-7f02 r-xp 00001000 fe:00 12 {lib}/libc10.so\n"
        f"7f02-7f03 r--p 00002000 fe:00 12 {lib}/libc10.so\n"
        "7f03-7f04 rw-p 00000000 00:00 0 \n"
        "7f04-7f05 r--p 00000000 fe:00 13 /usr/lib/libc.so.6\n"
    )
    assert loaded_libc10(maps) == [Path(f"{lib}/libc10.so")]
    with pytest.raises(memory.ProbeBroken, match="cannot list"):
        loaded_libc10(tmp_path / "absent")


def test_a_flag_that_does_not_take_is_caught_at_start(monkeypatch):
    # a bool that is not c10's: setting it changes nothing, so a helper thread's block goes uncounted
    monkeypatch.setattr(memory, "process_wide_accounting", lambda: ctypes.c_bool(False))
    probe = MemoryProbe(torch.device("cpu"), enabled=True)
    probe.start()
    assert not probe.enabled
    assert probe.why_not.startswith("not probed: FLAGS_caffe2_report_cpu_memory_usage did not take effect")
    assert not torch.autograd._profiler_enabled()  # no profiler left running into the steps
    with probe.probing():
        torch.ones(MIB)
    figures = probe.finish(7)
    assert (figures.peak_bytes, figures.resident_bytes, figures.input_pool_bytes) == (None, None, 7)
    assert figures.method == probe.why_not


def test_a_missing_symbol_leaves_the_figures_out_with_the_reason(monkeypatch):
    monkeypatch.setattr(memory, "ACCOUNTING_FLAG", "FLAGS_ddlbench_no_such_flag")
    process_wide_accounting.cache_clear()
    try:
        probe = MemoryProbe(torch.device("cpu"), enabled=True)
        probe.start()
        figures = probe.finish(0)
    finally:
        process_wide_accounting.cache_clear()  # the next lookup finds the real flag again
    assert figures.peak_bytes is None
    assert figures.method.startswith("not probed: the loaded ") and "FLAGS_ddlbench_no_such_flag" in figures.method


def test_a_runtime_error_in_the_probe_leaves_the_figures_out_with_the_reason(monkeypatch):
    def broken(profiler):
        raise RuntimeError("expected one range, found 0")

    monkeypatch.setattr(memory, "allocator_peak", broken)
    probe = MemoryProbe(torch.device("cpu"), enabled=True)
    probe.start()
    with probe.probing():
        torch.ones(MIB)
    figures = probe.finish(0)
    assert figures.peak_bytes is None and figures.resident_bytes is None
    assert figures.method == "not probed: the probe failed: RuntimeError: expected one range, found 0"
    assert not torch.autograd._profiler_enabled() and not process_wide_accounting().value


# what each rank process runs at start-up (sitecustomize) to break its probe in one way
BREAKAGES = {
    "missing_symbol": "import ddlbench.train.memory as m\nm.ACCOUNTING_FLAG = 'FLAGS_ddlbench_no_such_flag'\n",
    "runtime_error": (
        "import ddlbench.train.memory as m\n"
        "def broken(profiler):\n"
        "    raise RuntimeError('the profile does not add up')\n"
        "m.allocator_peak = broken\n"
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_a_broken_probe_leaves_an_ok_point_with_not_probed(tmp_path, monkeypatch, breakage):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BREAKAGES[breakage])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    point = make_point(warmup_steps=2, steps=2)
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    rank = record.ranks[0]
    assert rank.memory_probe.startswith("not probed: "), rank.memory_probe
    assert ("FLAGS_ddlbench_no_such_flag" if breakage == "missing_symbol" else "does not add up") in rank.memory_probe
    assert rank.tensor_peak_bytes is None and record.metrics.tensor_peak_bytes is None
    assert len(rank.step_times_s) == 2  # the point measured what it measures


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_window_is_the_probed_step_on_cuda_too():
    """The same window as on the CPU: sizes in whole 2 MiB, so the caching allocator rounds nothing."""
    device = torch.device("cuda")
    probe = MemoryProbe(device, enabled=True)
    probe.start()
    earlier = torch.empty(32 * MIB, dtype=torch.uint8, device=device)  # freed before the probed step
    del earlier
    kept = torch.empty(4 * MIB, dtype=torch.uint8, device=device)
    pool = torch.empty(2 * MIB, dtype=torch.uint8, device=device)
    with probe.probing():
        during = torch.empty(8 * MIB, dtype=torch.uint8, device=device)
        del during
    figures = probe.finish(pool.nbytes)
    assert figures.resident_bytes == kept.nbytes
    assert figures.peak_bytes == kept.nbytes + 8 * MIB
    assert figures.method.startswith("cuda caching allocator")
    # the whole run's peak, which the reset at the probed step's start must not lose
    assert probe.cuda_run_peaks()[0] >= 32 * MIB


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
    # blocks that gloo's worker thread frees (its clones inside reduce-scatter, FSDP's all-gather outputs
    # held by a finished work) count as freed there (ddlbench.train.memory): a probe that saw only the
    # rank thread's frees read 1.5P to 2.1P for fsdp and 3P for zero2 in one CI run of several
    assert fsdp.tensor_resident_bytes == pytest.approx(1.5 * params, rel=0.05)


def _gpipe_measured_and_predicted(tmp_path, *, model: str, dataset: str, steps: int):
    """A real GPipe run of `model` over two ranks and two micro-batches of one sample each, and the analytic
    model's prediction of it (memory: any machine will do, so the test's datasheet CPU)."""
    from ddlbench.analysis.analytic.layout import Setting
    from ddlbench.analysis.analytic.predict import predict
    from tests.test_analytic_model import cpu_machine

    point = make_point(
        model=model, dataset=dataset, model_options=(), strategy="gpipe", nodes=1, ranks_per_node=2, split=2,
        micro_batches=2, batch_size=2, warmup_steps=2, steps=steps,
    )  # fmt: skip
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    return record, predict(Setting.of_point(point), cpu_machine(), search_batch=False)


@pytest.mark.slow
def test_a_pipeline_stage_holds_one_new_linear_gradient_beside_its_grad_as_predicted(tmp_path):
    """GPipe over two micro-batches: the second micro-batch's backward computes each weight gradient anew and
    adds it into .grad, so for a moment the stage holds one more gradient of its largest weight (a convolution's
    twice: oneDNN's blocked buffer too). alexnet's classifier stage on CIFAR-10 holds two 4,096 → 4,096 Linears
    (67 MB each): the step's peak above the resident state holds that weight once, as the model predicts, not
    twice."""
    record, predicted = _gpipe_measured_and_predicted(tmp_path, model="alexnet", dataset="cifar10", steps=2)
    busiest = max(record.ranks, key=lambda rank: rank.tensor_peak_bytes)
    weight = 4 * 4096 * 4096
    assert busiest.tensor_resident_bytes == pytest.approx(predicted.resident_memory_bytes, rel=0.02)
    measured_step = busiest.tensor_peak_bytes - busiest.tensor_resident_bytes
    predicted_step = predicted.peak_memory_bytes - predicted.resident_memory_bytes
    assert measured_step > weight  # the new gradient is really held beside .grad
    # the rest of the step (the stage's activations at batch 2 on 32² images, its other gradients' temporaries)
    # is a few MB: a quarter of the weight (17 MB) tells once from twice
    assert abs(measured_step - predicted_step) < weight / 4, (measured_step / 1e6, predicted_step / 1e6)


@pytest.mark.slow
def test_a_pipelines_last_stage_holds_each_micro_batchs_logits_twice_as_predicted(tmp_path):
    """GPipe over two micro-batches of one sample: the last stage's output, the logits (1,024 tokens × 50,257
    words, 206 MB a sample), stays referenced by the stage's forward cache until that micro-batch's backward,
    beside the log-softmax the loss keeps: both micro-batches' logits twice each, 824 MB, at the step's peak.
    Data parallelism frees the logits once the loss has its log-softmax; a model that counted the pipeline's
    the same way predicted 0.69-0.72 of gpt_tiny's and gpt_nano's measured peaks."""
    record, predicted = _gpipe_measured_and_predicted(tmp_path, model="gpt_nano", dataset="tokens", steps=1)
    last = max(record.ranks, key=lambda rank: rank.rank)
    logits = 1024 * 50257 * 4  # one sample's
    assert last.tensor_peak_bytes - last.tensor_resident_bytes > 4 * logits  # twice each of two micro-batches
    # the rest is the block-by-block walk's slack: the gradients flowing beside the logits' (a fifth of a
    # sample's logits here); without the forward cache's copy the model is 2 × 206 MB under
    assert abs(predicted.peak_memory_bytes - last.tensor_peak_bytes) < logits / 2, (
        predicted.peak_memory_bytes / 1e6,
        last.tensor_peak_bytes / 1e6,
    )
