"""GPU requests on a real SLURM controller: the test cluster's nodes declare 2 GPUs each as GRES
(placeholder devices), so sbatch and srun parse, allocate and bind ddlbench's requests for real (the
job asks for GPUs per node, the ranks' step binds one to each task); the ranks run on the CPU and
record what SLURM made visible to them. Also: the srun step's environment, the site's network
variables, and refusals that depend on the cluster's state. Skips without the cluster of
tests/cluster/slurm.sh, unless DDLBENCH_REQUIRE_SLURM=1."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import BIN, make_point, run_cli, run_snakemake
from slurm_support import profile_env, records_of, sbatch_wait, sweep

from ddlbench.launch.launchers import SrunLauncher
from ddlbench.launch.placement import LAUNCH_VAR, settings_of
from ddlbench.launch.resources import Site
from ddlbench.records import PointRecord, read_record

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def gpu_env(tmp_path_factory) -> dict[str, str]:
    """A profile as `ddlbench profile slurm --partition gpu --gpus-per-rank 1 --network-env …` writes it."""
    return profile_env(tmp_path_factory, Site(partition="gpu", gpus_per_rank=1, time_margin_s=60, network_env=NETWORK))


# what the site's network_env gives every rank (NCCL's logging: harmless where no NCCL runs)
NETWORK = {"NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": "1"}


def sacct(job_id: str, env: dict[str, str]) -> dict[str, dict[str, str]]:
    """Job and steps of `job_id` as sacct accounts them: JobID → {NTasks, NNodes, State, AllocTRES}."""
    out = subprocess.run(
        ["sacct", "-j", job_id, "-P", "-n", "-o", "JobID,NTasks,NNodes,State,AllocTRES"],
        capture_output=True, text=True, check=True, env={**os.environ, **env},
    ).stdout  # fmt: skip
    rows = {}
    for line in out.splitlines():
        job, tasks, nodes, state, tres = line.split("|")
        rows[job] = {"NTasks": tasks, "NNodes": nodes, "State": state, "AllocTRES": tres}
    return rows


def scontrol_job(job_id: str, env: dict[str, str]) -> str:
    return subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True, env={**os.environ, **env}
    ).stdout


def assert_two_gpus_on_each_of_two_nodes(record: PointRecord, env: dict[str, str]) -> None:
    """What SLURM allocated (sacct, scontrol) and what each rank saw agree: 2 nodes × 2 GPUs, 4 ranks started."""
    assert record.status == "ok", record.reason
    job = record.provenance.slurm
    assert (job.num_nodes, job.num_gpus, job.exclusive) == (2, 4, True)
    job_id = f"{job.array_job_id}_{job.array_task_id}" if job.array_task_id else job.job_id
    assert "TresPerNode=gres:gpu:2" in scontrol_job(job_id, env)  # asked per node, not per task
    steps = sacct(job_id, env)
    whole = next(row for key, row in steps.items() if "." not in key)
    assert "gres/gpu=4" in whole["AllocTRES"] and whole["NNodes"] == "2"
    # the ranks' step: 4 tasks over both nodes with all 4 GPUs, so 2 per node
    ranks_step = [row for key, row in steps.items() if row["NTasks"] == "4"]
    assert len(ranks_step) == 1, steps
    assert "gres/gpu=4" in ranks_step[0]["AllocTRES"] and ranks_step[0]["NNodes"] == "2"
    assert ranks_step[0]["State"] == "COMPLETED"
    assert sorted(rank.rank for rank in record.ranks) == [0, 1, 2, 3]
    per_node = Counter(rank.slurm_node for rank in record.ranks)
    assert sorted(per_node.values()) == [2, 2] and "" not in per_node, per_node
    # the step bound one GPU to each task: each rank sees its own, and the two of a node differ
    for node in per_node:
        seen = sorted(rank.gpu["visible"] for rank in record.ranks if rank.slurm_node == node)
        assert seen == ["0", "1"], (node, seen)
    assert {rank.gpu.get("bind") for rank in record.ranks} == {"single:1"}
    assert all(rank.network_env == NETWORK for rank in record.ranks)


def test_gpu_sweep_through_snakemake_gets_its_gpus_per_node(gpu_env, write_sweep, tmp_path):
    """The profile names no memory: each point's comes from the partition, and every shape of a 1–2 × 1–2
    sweep is accepted by sbatch and runs."""
    sweep_file = sweep(write_sweep, "gpus", nodes=[1, 2], ranks_per_node=[1, 2], oversubscribe=True)
    result = run_snakemake("--profile", "slurm", "--configfile", str(sweep_file), env=gpu_env)
    assert result.returncode == 0, result.stderr[-3000:]
    records = {point_id.split("-")[3]: record for point_id, record in records_of(tmp_path / "results" / "gpus").items()}
    assert {shape: record.status for shape, record in records.items()} == dict.fromkeys(
        ("n1x1", "n1x2", "n2x1", "n2x2"), "ok"
    )
    assert_two_gpus_on_each_of_two_nodes(records["n2x2"], gpu_env)
    # one rank asks for one GPU and sees one; its exclusive job holds the node's two (SLURM gives an
    # --exclusive job every GRES of its nodes), which the record says
    single = records["n1x1"]
    assert [(rank.gpu["visible"], rank.gpu["bind"]) for rank in single.ranks] == [("0", "single:1")]
    assert (single.provenance.slurm.num_gpus, single.provenance.slurm.exclusive) == (2, True)


def test_gpu_point_through_submit_gets_its_gpus_per_node(gpu_env, write_sweep, tmp_path):
    sweep_file = sweep(write_sweep, "gpus-submit", nodes=[2], ranks_per_node=[2], oversubscribe=True)
    submitted = run_cli("submit", "--configfile", str(sweep_file), env=gpu_env)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    (record,) = records_of(tmp_path / "results" / "gpus-submit").values()
    assert_two_gpus_on_each_of_two_nodes(record, gpu_env)


def test_the_ranks_srun_step_gives_each_task_a_gpu_of_its_own(gpu_env, tmp_path):
    """The srun options SrunLauncher gives a 2-rank point's step on a site with gpus_per_rank 1, run for real
    on a node of the gpu partition in a job that asked for the node's 2 GPUs (--gres, as a point's job
    does): srun takes --gpus-per-task and --gpu-bind beside --ntasks-per-node and --cpus-per-task, and each
    task sees exactly one GPU, not its neighbour's. A site's map_gpu binding is followed; `none` binds
    nothing (CUDA_VISIBLE_DEVICES unset: every GPU of the node)."""
    point = make_point(ranks_per_node=2)
    steps = []
    for bind in ("single:1", "map_gpu:1,0", "none"):
        settings = settings_of(Site(partition="gpu", gpus_per_rank=1, gpu_bind=bind)).to_json()
        command = SrunLauncher({LAUNCH_VAR: settings}).command(point, rank_dir=tmp_path, dump_params=None)
        options = command[: command.index("--export=ALL") + 1]
        assert options[5:8] == ["--gpus-per-task=1", f"--gpu-bind={bind}", "--overlap"], options
        show = f'echo "{bind} $SLURM_LOCALID ${{CUDA_VISIBLE_DEVICES-unset}}"'
        steps.append(shlex.join([*options, "bash", "-c", show]))
    out = tmp_path / "job.out"
    batch = sbatch_wait(
        ["-p", "gpu", "--nodes=1", "--ntasks=2", "--gres=gpu:2", "--mem=1000M", "--time=5",
         f"--output={out}", "--wrap", " && ".join(steps)],
        env={**os.environ, **gpu_env},
    )  # fmt: skip
    assert batch.returncode == 0, batch.stderr + out.read_text()
    seen = sorted(tuple(line.split()) for line in out.read_text().splitlines() if line.split()[:1] != ["srun:"])
    assert seen == [
        ("map_gpu:1,0", "0", "1"), ("map_gpu:1,0", "1", "0"),
        ("none", "0", "unset"), ("none", "1", "unset"),
        ("single:1", "0", "0"), ("single:1", "1", "1"),
    ], out.read_text()  # fmt: skip


def test_ranks_start_whatever_task_geometry_the_job_script_exported(gpu_env, tmp_path):
    """A job submitted with --ntasks-per-gpu (or --cpus-per-task, --tres-per-task…) hands SLURM_NTASKS_PER_GPU
    (and the like) to every srun inside it; srun then refuses ddlbench's --ntasks-per-node ("mutually
    exclusive with --ntasks-per-gpu and SLURM_NTASKS_PER_GPU", Slurm 22.05). The ranks' step drops them."""
    env = {**os.environ, **gpu_env}
    conflicting = "export SLURM_NTASKS_PER_GPU=1 SLURM_TRES_PER_TASK=cpu:1 SLURM_CPUS_PER_TASK=2; "
    bare = sbatch_wait(
        ["-p", "gpu", "--nodes=1", "--ntasks=2", "--gres=gpu:2", "--mem=3000M", "--time=5",
         f"--output={tmp_path / 'bare.out'}", "--wrap", conflicting + "srun --overlap -n2 --ntasks-per-node=2 true"],
        env=env,
    )  # fmt: skip
    assert bare.returncode != 0, "the hazard is real: plain srun refuses the step"
    assert "mutually exclusive" in (tmp_path / "bare.out").read_text()
    point = make_point(ranks_per_node=2, oversubscribe=True)
    command = shlex.join(
        [str(BIN / "ddlbench"), "run-point", "--spec", point.to_json(), "--out", str(tmp_path / "r.json"),
         "--launcher", "srun"]
    )  # fmt: skip
    batch = sbatch_wait(
        ["-p", "gpu", "--nodes=1", "--ntasks=2", "--gres=gpu:2", "--mem=3000M", "--time=5",
         f"--output={tmp_path / 'job.out'}", "--wrap", conflicting + command],
        env=env,
    )  # fmt: skip
    assert batch.returncode == 0, batch.stderr + (tmp_path / "job.out").read_text()
    record = read_record(tmp_path / "r.json")
    assert record.status == "ok", record.reason
    assert [rank.gpu["visible"] for rank in record.ranks] == ["0,1", "0,1"]


def _refused(sweep_file: Path, env: dict[str, str], fragment: str) -> None:
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    submitted = run_cli("submit", "--configfile", str(sweep_file), "--no-wait", env=env)
    assert submitted.returncode == 2, submitted.stdout
    assert fragment in submitted.stderr and "point resnet8-cifar10-ddp-" in submitted.stderr, submitted.stderr
    snakemake = run_snakemake("--profile", "slurm", "--configfile", str(sweep_file), env=env)
    assert snakemake.returncode == 2
    assert fragment in snakemake.stderr and "Traceback" not in snakemake.stderr
    assert subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout == before


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"ranks_per_node": [3]}, "needs 3 GPUs per node, but the nodes of partition 'gpu' have at most 2"),
        ({"slurm": {"mem_per_rank_mb": 100000}}, "MB of memory per node (100000 MB per rank from the sweep"),
        ({"threads": [3]}, "needs 3 CPUs per node, but the nodes of partition 'gpu' have at most 2"),
    ],
)
def test_shapes_no_node_can_hold_are_refused_before_submission(gpu_env, write_sweep, overrides, fragment):
    _refused(sweep(write_sweep, "refused", **{"oversubscribe": True, **overrides}), gpu_env, fragment)


def test_a_down_partition_and_drained_nodes_are_refused_before_submission(gpu_env, write_sweep):
    env = {**os.environ, **gpu_env}

    def scontrol(*args: str) -> None:
        subprocess.run(["scontrol", "update", *args], check=True, env=env)

    sweep_file = sweep(write_sweep, "refused-state", nodes=[2])
    scontrol("PartitionName=gpu", "State=DOWN")
    try:
        _refused(sweep_file, gpu_env, "partition 'gpu' is DOWN, not UP")
    finally:
        scontrol("PartitionName=gpu", "State=UP")
    scontrol("NodeName=n[2-4]", "State=DRAIN", "Reason=ddlbench-test")
    try:
        _refused(sweep_file, gpu_env, "but only 1 of the 4 nodes of partition 'gpu' that have them take jobs")
    finally:
        scontrol("NodeName=n[2-4]", "State=RESUME")


TINY_SUITE = """\
name: tiny_gpu_machine
ranks_per_node: 2
threads: 1
precisions: [fp32]
matmul_sizes: [64]
conv_shapes: []
memory_bytes: 1048576
collectives: []
backends: [torch]
warmup: 1
iterations: 2
timeout_s: 120
"""


def test_a_gpu_sweeps_calibration_job_runs_where_its_points_run(gpu_env, write_sweep, tmp_path):
    """The calibrate_machine rule's job takes the partition, GPUs and memory of the sweep's points (2 ranks
    per node, a GPU each), not the profile's defaults: a GPU sweep is calibrated on a GPU node."""
    suite = tmp_path / "suite.yaml"
    suite.write_text(TINY_SUITE + f"results_dir: {tmp_path / 'results'}\n")  # not the repository's results/
    sweep_file = sweep(write_sweep, "gpucal", nodes=[1], ranks_per_node=[2], oversubscribe=True, calibrate=str(suite))
    result = run_snakemake("--profile", "slurm", "--configfile", str(sweep_file), "--until", "calibrate_machine",
                           env=gpu_env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    submitted = [line for line in result.stderr.splitlines() if "has been submitted with SLURM jobid" in line]
    assert len(submitted) == 1, submitted  # the calibration alone
    job_id = submitted[0].split("SLURM jobid ")[1].split()[0]
    job = scontrol_job(job_id, gpu_env)
    assert "Partition=gpu" in job and "TresPerNode=gres:gpu:2" in job, job
    whole = next(row for key, row in sacct(job_id, gpu_env).items() if "." not in key)
    assert "gres/gpu=2" in whole["AllocTRES"] and whole["State"] == "COMPLETED", whole
    assert (tmp_path / "results" / "gpucal" / "machine.yaml").exists()
