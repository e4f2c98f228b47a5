"""The horovod strategy: Horovod brought up inside ranks that ddlbench launched (no horovodrun), checked
against one process training on the same global batches; and the clear failure when horovod is absent.

Tests that run Horovod skip when it is not importable (`make horovod` installs it), unless
DDLBENCH_REQUIRE_HOROVOD=1 (CI sets it), when they fail instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from ddlbench.errors import DdlbenchError
from ddlbench.launch.runner import run_point
from ddlbench.train.strategies import RankContext, StrategySetup
from ddlbench.train.strategies.horovod import Slot, parallelize_horovod, plan_slots
from tests.conftest import make_point
from tests.equivalence import check_against_reference


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.equivalence_sse
def test_two_rank_horovod_matches_single_process(tmp_path, horovod_installed):
    # GroupNorm: each rank's half of the batch computes what the full batch does. The reference runs the
    # same halves (shards=2, their gradients averaged, the same step in exact arithmetic), so each sample's
    # forward is the same sums at the same batch size on both sides: a CPU whose kernels round a sample
    # otherwise in a batch of 4 than in one of 8 (oneDNN's SSE4.1 convolutions on one host: 4.35 bounds
    # away against one full-batch step) cannot fail it. Horovod averages the gradients in another order
    # than the reference sums them: within the rounding bound of tests/equivalence.py
    record = check_against_reference(
        tmp_path,
        shards=2,
        strategy="horovod",
        model="resnet8",
        nodes=1,
        ranks_per_node=2,
        batch_size=8,
        model_options=(("norm", "group"),),
        strategy_options=(("fusion_threshold_mb", "1"),),
    )
    # a status of ok also says both ranks exited 0: hvd.shutdown() and the worker's teardown neither hung nor aborted
    assert record.status == "ok"
    for rank, result in enumerate(sorted(record.ranks, key=lambda r: r.rank)):
        facts = result.facts
        assert facts["mesh"] == {"dp": 2} and facts["coords"] == {"dp": rank}
        assert facts["controller"] == "gloo"
        assert facts["fusion_threshold_mb"] == 1.0 and facts["fusion_threshold_bytes"] == 1024 * 1024
        # one host: both ranks are local to each other and there is one "cross" group per local rank
        assert (facts["local_rank"], facts["local_size"], facts["cross_size"], facts["hosts"]) == (rank, 2, 1, 1)
        assert facts["local_parameters"] > 0 and facts["horovod_version"] == "0.28.1"
        assert facts["gpu_allreduce"] is None  # CPU run
        assert len(result.losses) == 4  # warm-up + 3 measured steps, every rank reports its slice's loss


# Two ranks joined in torch.distributed as ddlbench's worker joins them, then Horovod on top: a few steps,
# close() (hvd.shutdown) with rank 0 arriving late, then the worker's own teardown and os._exit.
_SHUTDOWN_RANK = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist
    from torch import nn
    from ddlbench.train.strategies import RankContext, StrategySetup
    from ddlbench.train.strategies.horovod import parallelize_horovod

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=os.environ["INIT"], rank=rank, world_size=2)
    ctx = RankContext(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"), backend="gloo")
    setup = StrategySetup(ctx=ctx, make_optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                          loss_fn=nn.functional.cross_entropy, sample=torch.zeros(1, 4), global_batch_size=8)
    torch.manual_seed(0)
    trainer = parallelize_horovod(nn.Sequential(nn.Linear(4, 2)), setup)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    start, stop = trainer.local_batch_range(8)
    for _ in range(2):
        trainer.step(x[start:stop], y[start:stop])
    if rank == 0:
        time.sleep(1.0)  # rank 1 shuts Horovod down first, as a rank with less to write would
    trainer.close()
    trainer.close()  # idempotent
    state = trainer.full_state_dict()  # needs no Horovod: rank 0's copy of the replica
    assert (state is not None) == (rank == 0)
    print("CLOSED", rank, flush=True)
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)
    """
)


@pytest.mark.slow
def test_close_then_worker_teardown_exits_cleanly(tmp_path, horovod_installed):
    script = tmp_path / "rank.py"
    script.write_text(_SHUTDOWN_RANK)
    env = {**os.environ, "INIT": f"file://{tmp_path / 'store'}", "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script)], env=env | {"RANK": str(rank)}, stdout=subprocess.PIPE, text=True
        )
        for rank in range(2)
    ]
    try:
        outputs = [process.communicate(timeout=60)[0] for process in ranks]
    finally:
        for process in ranks:
            process.kill()  # no-op for a rank that has exited; frees the port and CPU if one hung
    # a hang would raise TimeoutExpired above; an abort would show as a negative return code
    assert [process.returncode for process in ranks] == [0, 0]
    assert [f"CLOSED {rank}" in out for rank, out in enumerate(outputs)] == [True, True]


def test_slots_follow_horovodrun_host_assignment():
    # two hosts with two ranks each, ranks placed host by host (srun's block distribution)
    assert plan_slots(["a", "a", "b", "b"]) == [
        Slot(hostname="a", rank=0, size=4, local_rank=0, local_size=2, cross_rank=0, cross_size=2),
        Slot(hostname="a", rank=1, size=4, local_rank=1, local_size=2, cross_rank=0, cross_size=2),
        Slot(hostname="b", rank=2, size=4, local_rank=0, local_size=2, cross_rank=1, cross_size=2),
        Slot(hostname="b", rank=3, size=4, local_rank=1, local_size=2, cross_rank=1, cross_size=2),
    ]
    # uneven hosts and interleaved placement: a local rank's cross group holds only the hosts that have it
    slots = plan_slots(["a", "b", "a", "a"])
    assert [(s.local_rank, s.local_size) for s in slots] == [(0, 3), (0, 1), (1, 3), (2, 3)]
    assert [(s.cross_rank, s.cross_size) for s in slots] == [(0, 2), (1, 2), (0, 1), (0, 1)]
    assert all(s.size == 4 for s in slots)


def _setup() -> StrategySetup:
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    return StrategySetup(
        ctx=ctx,
        make_optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
        loss_fn=nn.functional.cross_entropy,
        sample=torch.zeros(1, 4),
        global_batch_size=8,
    )


def test_missing_horovod_names_the_setup_step(monkeypatch):
    # None in sys.modules makes `import horovod` fail as it does where horovod is not installed
    monkeypatch.setitem(sys.modules, "horovod", None)
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    with pytest.raises(DdlbenchError, match="horovod is not installed") as error:
        parallelize_horovod(nn.Sequential(nn.Linear(4, 2)), _setup())
    assert "make horovod" in str(error.value) and "envs/horovod.sh" in str(error.value)


@pytest.mark.slow
def test_point_without_horovod_records_the_reason(tmp_path, monkeypatch):
    # a `horovod` package that fails to import shadows any installed one in the ranks' processes
    fake = tmp_path / "shadow" / "horovod"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no horovod in this test')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")]))
    point = make_point(strategy="horovod", nodes=1, ranks_per_node=2, steps=1)
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    assert record.status == "failed"
    assert "horovod is not installed" in record.reason and "make horovod" in record.reason
