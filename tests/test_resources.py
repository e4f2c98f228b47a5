"""The point → SLURM allocation mapping (golden), site settings, pre-submission checks, and parsing of
what SLURM prints. Pure: no cluster needed; the real cluster is in test_slurm_cluster.py."""

from __future__ import annotations

import pytest
import yaml
from conftest import make_point

from ddlbench.errors import ConfigError, DdlbenchError
from ddlbench.launch.profile import MARKER, ProfileOptions, write_profile
from ddlbench.launch.resources import (
    LAUNCHER_MEM_MB,
    Site,
    resources_for,
    site_from_mapping,
    snakemake_resources,
    submitit_parameters,
)
from ddlbench.launch.slurm import (
    Partition,
    QueuedJob,
    check_resources,
    parse_allocation,
    parse_partitions,
    parse_queue,
    parse_time_min,
)
from ddlbench.launch.status import sweep_status
from ddlbench.sweep import plan_sweep
from ddlbench.train.faults import planned_fault

SITE = Site(partition="gpu", account="proj42", gpus_per_rank=1, mem_per_rank_mb=8000, time_margin_s=300)


def test_resources_of_a_multi_node_point_golden():
    point = make_point(nodes=4, ranks_per_node=4, threads=8, timeout_s=900)
    resources = resources_for(point, SITE)
    assert resources.ntasks == 16
    assert resources.mem_per_node_mb == 4 * 8000 + LAUNCHER_MEM_MB
    assert resources.time_min == 20  # (900 + 300) s
    assert resources.time_limit == "0-00:20:00"
    assert snakemake_resources(resources) == {
        "slurm_partition": "gpu",
        "slurm_account": "proj42",
        "nodes": 4,
        "cpus_per_task": 8,
        "mem_mb": 32768,
        "runtime": 20,
        "mpi": "srun",
        "tasks": 0,
        "tasks_per_node": 4,
        "gres": "gpu:4",
        "tasks_per_gpu": 1,
    }
    assert submitit_parameters(resources) == {
        "slurm_partition": "gpu",
        "nodes": 1,
        "tasks_per_node": 1,
        "cpus_per_task": 8,
        "slurm_mem": "32768M",
        "timeout_min": 20,
        "slurm_signal_delay_s": 90,
        "slurm_srun_args": ["--ntasks=1", "--nodes=1"],
        "slurm_additional_parameters": {"nodes": 4, "ntasks_per_node": 4, "account": "proj42"},
        "gpus_per_node": 4,
    }


def test_one_rank_and_one_rank_per_node_points_keep_the_same_resource_keys():
    site = Site(partition="cpu", mem_per_rank_mb=1000, time_margin_s=60)
    single = snakemake_resources(resources_for(make_point(timeout_s=61), site))
    spread = snakemake_resources(resources_for(make_point(nodes=3, timeout_s=61), site))
    assert single.keys() == spread.keys()  # Snakemake needs one set of keys per rule
    assert (single["mpi"], single["tasks"], single["tasks_per_node"]) == ("", 1, 0)
    assert (spread["mpi"], spread["tasks"], spread["tasks_per_node"]) == ("srun", 3, 0)
    assert single["runtime"] == 3  # 121 s rounds up to whole minutes


def test_sweep_settings_and_rerun_factors_change_the_allocation_not_the_point():
    point = make_point(timeout_s=600)
    resources = resources_for(point, SITE, partition="big", mem_per_rank_mb=100, mem_factor=2, time_factor=2)
    assert resources.partition == "big"
    assert resources.mem_per_node_mb == 200 + LAUNCHER_MEM_MB
    assert resources.time_min == 25  # (2 × 600 + 300) s
    assert resources_for(point, SITE).signal_delay_s == 90
    assert resources_for(point, Site(partition="p", time_margin_s=30)).signal_delay_s == 15


@pytest.mark.parametrize(
    ("raw", "key", "fragment"),
    [
        ({}, "partition", "must name the SLURM partition"),
        ({"partition": "p", "gpus": 1}, "gpus", "unknown site setting"),
        ({"partition": "p", "mem_per_rank_mb": "lots"}, "mem_per_rank_mb", "integer >= 16"),
        ({"partition": "p", "time_margin_s": -1}, "time_margin_s", "integer >= 0"),
        ({"partition": " "}, "partition", "not a name"),
        ({"partition": "p", "require_account": "yes"}, "require_account", "true or false"),
    ],
)
def test_bad_site_settings_name_the_key(raw, key, fragment):
    with pytest.raises(ConfigError) as error:
        site_from_mapping(raw)
    assert error.value.key == key
    assert fragment in str(error.value)


PARTITIONS_TEXT = (
    "PartitionName=cpu AllowGroups=ALL Default=YES MaxTime=02:00:00 Nodes=n[1-4] State=UP TotalCPUs=8 TotalNodes=4\n"
    "PartitionName=gpu AllowGroups=ALL Default=NO MaxTime=1-00:00:00 Nodes=g[1-2] State=UP TotalNodes=2\n"
    "PartitionName=debug MaxTime=UNLIMITED TotalNodes=1 State=DOWN\n"
)


def test_partitions_and_times_are_parsed():
    partitions = parse_partitions(PARTITIONS_TEXT)
    assert partitions["cpu"] == Partition(name="cpu", total_nodes=4, max_time_min=120, state="UP")
    assert partitions["gpu"].max_time_min == 24 * 60
    assert partitions["debug"].max_time_min is None
    assert [parse_time_min(t) for t in ("30", "5:00", "1:00:01", "2-03", "2-03:04:00", "INFINITE")] == [
        30,
        5,
        61,
        2 * 1440 + 180,
        2 * 1440 + 184,
        None,
    ]


@pytest.mark.parametrize(
    ("point_kw", "site_kw", "account_required", "fragment"),
    [
        ({}, {"partition": "gpux"}, False, "partition 'gpux' does not exist; partitions of this cluster: cpu, debug"),
        ({"nodes": 8}, {"partition": "cpu"}, False, "needs 8 nodes, but partition 'cpu' has 4"),
        ({"timeout_s": 3 * 3600}, {"partition": "cpu"}, False, "is over the 120 min that partition 'cpu' allows"),
        ({}, {"partition": "cpu"}, True, "requires an account and none is set"),
    ],
)
def test_points_the_cluster_would_refuse_are_refused_before_submission(point_kw, site_kw, account_required, fragment):
    point = make_point(**point_kw)
    planned = [(point.point_id, resources_for(point, Site(**site_kw)))]
    with pytest.raises(DdlbenchError) as error:
        check_resources(planned, parse_partitions(PARTITIONS_TEXT), account_required=account_required)
    assert f"point {point.point_id}:" in str(error.value)
    assert fragment in str(error.value)


def test_a_point_that_fits_passes_the_checks():
    point = make_point(nodes=4, timeout_s=3600)
    site = Site(partition="cpu", account="a", time_margin_s=300)
    check_resources(
        [(point.point_id, resources_for(point, site))], parse_partitions(PARTITIONS_TEXT), account_required=True
    )


def test_allocation_is_read_from_scontrol():
    line = (
        "JobId=57 ArrayJobId=50 ArrayTaskId=3 JobName=x UserId=root(0) Restarts=1 Partition=gpu "
        "NodeList=g[1-2] NumNodes=2 NumCPUs=16 NumTasks=8 AllocTRES=cpu=16,mem=64G,node=2,gres/gpu=8 Comment=x y"
    )
    job = parse_allocation("57", line)
    assert (job.job_id, job.array_job_id, job.array_task_id) == ("57", "50", "3")
    assert (job.partition, job.node_list, job.num_nodes, job.num_cpus, job.num_gpus, job.restarts) == (
        "gpu",
        "g[1-2]",
        2,
        16,
        8,
        1,
    )
    plain = parse_allocation("9", "JobId=9 Partition=cpu NodeList=n1 NumNodes=1 NumCPUs=2 AllocTRES=cpu=2")
    assert (plain.array_job_id, plain.num_gpus, plain.restarts) == (None, 0, 0)


def test_status_joins_records_and_the_queue(tmp_path):
    from ddlbench.launch.runner import write_unfinished_record

    plan = plan_sweep(
        {"models": ["resnet8"], "datasets": ["cifar10"], "strategies": ["ddp"], "nodes": [1, 2, 3, 4],
         "results_dir": str(tmp_path)}
    )  # fmt: skip
    p1, p2, p3, p4 = plan.points
    sweep_dir = plan.config.sweep_dir
    write_unfinished_record(p1, out=sweep_dir / "points" / p1.point_id / "record.json", status="oom", reason="big")
    queue = parse_queue(
        f"101|RUNNING|uuid|rule_run_point_wildcards_{p2.point_id}\n77_1|PENDING|ddlbench-x|\n5|RUNNING|other|\n"
    )
    assert queue[1] == QueuedJob(job_id="77_1", state="PENDING", name="ddlbench-x", comment="")
    statuses = sweep_status(plan, queue=queue, jobs_index={p3.point_id: ["77_1"]}, sweep_dir=sweep_dir)
    by_id = {status.point_id: status for status in statuses}
    assert (by_id[p1.point_id].state, by_id[p1.point_id].reason) == ("oom", "big")
    assert (by_id[p2.point_id].state, by_id[p2.point_id].job_ids) == ("running", ("101",))
    assert (by_id[p3.point_id].state, by_id[p3.point_id].job_ids) == ("pending", ("77_1",))
    assert by_id[p4.point_id].state == "not started"


def test_profile_is_written_where_snakemake_looks_and_refuses_a_foreign_one(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    site = Site(partition="gpu's", account="a b")  # quoting: values never reach YAML raw
    config = write_profile(site, ProfileOptions(jobs=7, status_wait_s=3))
    assert config == tmp_path / "snakemake" / "slurm" / "config.yaml"
    profile = yaml.safe_load(config.read_text())
    assert profile["executor"] == "slurm"
    assert profile["jobs"] == 7
    assert profile["slurm-init-seconds-before-status-checks"] == 3
    assert profile["default-resources"] == {"slurm_partition": "gpu's", "slurm_account": "a b", "mem_mb": 1000,
                                            "runtime": 30}  # fmt: skip
    site_file = config.parent / "ddlbench-site.yaml"
    assert profile["config"] == [f"slurm_site={site_file}"]
    assert site_from_mapping(yaml.safe_load(site_file.read_text())) == site
    config.write_text("executor: slurm\n")  # someone else's profile
    with pytest.raises(DdlbenchError, match="was not written by ddlbench"):
        write_profile(site, ProfileOptions())
    assert MARKER in write_profile(site, ProfileOptions(), force=True).read_text()


def test_faults_can_target_points_and_first_runs_only():
    env = {"DDLBENCH_INJECT_FAULT": "raise@-n1x1-,hang~first@-n2x1-"}
    assert planned_fault("m-d-s-n1x1-b8", env) == "raise"
    assert planned_fault("m-d-s-n2x1-b8", env) == "hang"
    assert planned_fault("m-d-s-n2x1-b8", env | {"SLURM_RESTART_COUNT": "1"}) is None
    assert planned_fault("m-d-s-n4x1-b8", env) is None
    with pytest.raises(ValueError, match="unknown fault 'hang~later'"):
        planned_fault("x", {"DDLBENCH_INJECT_FAULT": "hang~later"})
