"""Whether a job could ever start under the limits read for it, and how wide and long packed allocations
may be under them (the real cluster's QOS MaxWall refusal is in tests/test_slurm_limits.py)."""

from __future__ import annotations

import pytest
from conftest import make_point

from ddlbench.errors import DdlbenchError
from ddlbench.launch.admission import JobShape, caps, check_submission, never_starts
from ddlbench.launch.limits import JobLimit, Limit, UserLimits, build_limits, parse_associations, parse_qos, parse_tres
from ddlbench.launch.packed import pack_width, packing_bounds
from ddlbench.launch.resources import Site, resources_for
from ddlbench.launch.slurm import ClusterFacts, Node, Partition, parse_partitions

PARTITION = Partition(name="gpu", total_nodes=8, max_time_min=24 * 60, state="UP")
FACTS = ClusterFacts(
    partitions={"gpu": PARTITION},
    nodes={
        f"g{i}": Node(name=f"g{i}", cpus=64, memory_mb=512_000, gpus=4, state="IDLE", partitions=("gpu",))
        for i in range(8)
    },
    limits_enforced=True,
    user="ana",
    default_account="proj",
    cluster_name="hpc",
)
SHAPE = JobShape(nodes=2, cpus_per_node=32, mem_per_node_mb=64_000, gpus_per_node=4, time_min=40)


def limits(*per_job: JobLimit, qos: str = "normal", account: str = "proj", running=()) -> UserLimits:
    return UserLimits(user="ana", account=account, qos=qos, per_job=per_job, running=running)


def test_tres_are_read_with_units_and_typed_gpus():
    assert dict(parse_tres("cpu=64,mem=2G,node=4,gres/gpu:a100=4,gres/gpu:h100=2,billing=")) == {
        "cpu": 64, "mem": 2048, "node": 4, "gres/gpu": 6,
    }  # fmt: skip
    assert parse_tres("") == ()


@pytest.mark.parametrize(
    ("limit", "words"),
    [
        (JobLimit(name="QOS 'normal' MaxWall", minutes=30), "time limit 40 min is over QOS 'normal' MaxWall=30 min"),
        (JobLimit(name="QOS 'normal' MaxTRESPerJob", tres=(("node", 1),)), "needs 2 nodes in all, over"),
        (JobLimit(name="association proj/ana GrpTRES", tres=(("cpu", 48),)), "needs 64 CPUs in all"),
        (JobLimit(name="QOS 'normal' MaxTRESPerUser", tres=(("gres/gpu", 4),)), "needs 8 GPUs in all"),
        (JobLimit(name="QOS 'normal' MaxTRESPerNode", tres=(("gres/gpu", 2),), per="node"), "needs 4 GPUs per node"),
        (JobLimit(name="QOS 'normal' MaxTRESPerJob", tres=(("mem", 100_000),)), "needs 128000 MB of memory in all"),
    ],
)
def test_a_job_over_a_per_job_limit_never_starts_and_the_refusal_names_it(limit, words):
    problem = never_starts(SHAPE, partition=PARTITION, limits=limits(limit))
    assert problem is not None and words in problem
    assert limit.name in problem and "wait forever" in problem


def test_a_job_within_every_limit_may_start():
    within = (
        JobLimit(name="QOS 'normal' MaxWall", minutes=40),
        JobLimit(name="QOS 'normal' MaxTRESPerJob", tres=(("node", 2), ("cpu", 64), ("gres/gpu", 8))),
        JobLimit(name="QOS 'normal' MaxTRESPerNode", tres=(("gres/gpu", 4),), per="node"),
    )
    assert never_starts(SHAPE, partition=PARTITION, limits=limits(*within)) is None
    whole_nodes = JobShape(nodes=2, cpus_per_node=32, mem_per_node_mb=None, gpus_per_node=4, time_min=40)
    memory = JobLimit(name="QOS 'normal' MaxTRESPerJob", tres=(("mem", 1000),))
    assert never_starts(whole_nodes, partition=PARTITION, limits=limits(memory)) is None  # --mem=0: not counted


def test_partitions_that_leave_out_the_qos_or_account_refuse_it():
    text = (
        "PartitionName=gpu AllowAccounts=ALL AllowQos=gpu_normal,gpu_long MaxNodes=4 MaxTime=1-00:00:00 "
        "MaxCPUsPerNode=48 State=UP TotalNodes=8 DenyAccounts=students\n"
    )
    partition = parse_partitions(text)["gpu"]
    assert (partition.max_nodes, partition.max_cpus_per_node) == (4, 48)
    refused = never_starts(SHAPE, partition=partition, limits=limits(qos="normal"))
    assert "QOS 'normal' may not submit to partition 'gpu' (AllowQos=gpu_normal, gpu_long)" in refused
    assert never_starts(SHAPE, partition=partition, limits=limits(qos="gpu_long")) is None
    denied = never_starts(SHAPE, partition=partition, limits=limits(qos="gpu_long", account="students"))
    assert "account 'students' may not submit to partition 'gpu'" in denied


def test_maxjobs_zero_means_never():
    zero = (Limit(name="association proj/ana MaxJobs", value=0, account="proj"),)
    assert "MaxJobs is 0" in never_starts(SHAPE, partition=PARTITION, limits=limits(running=zero))
    none_queued = (Limit(name="QOS 'normal' MaxSubmitJobsPerUser", value=0, qos="normal"),)
    no_room = UserLimits(user="ana", account="proj", qos="normal", submit=none_queued)
    assert "MaxSubmitJobsPerUser is 0" in never_starts(SHAPE, partition=PARTITION, limits=no_room)


def test_qos_and_association_rows_give_the_per_job_limits():
    from ddlbench.launch.limits import ASSOC_FIELDS, QOS_FIELDS

    assoc = dict.fromkeys(ASSOC_FIELDS, "") | {
        "Cluster": "hpc", "Account": "proj", "User": "ana", "MaxWall": "2:00:00", "GrpTRES": "node=3",
    }  # fmt: skip
    qos = dict.fromkeys(QOS_FIELDS, "") | {"Name": "normal", "MaxWall": "1-00:00:00", "MaxTRESPU": "gres/gpu=16"}
    built = build_limits(
        user="ana", account=None, qos=None, partition="gpu", facts=FACTS,
        associations=parse_associations("|".join(assoc[f] for f in ASSOC_FIELDS) + "\n"),
        qos_table=parse_qos("|".join(qos[f] for f in QOS_FIELDS) + "\n"),
    )  # fmt: skip
    found = {limit.name: (limit.minutes, dict(limit.tres)) for limit in built.per_job}
    assert found == {
        "association proj/ana MaxWall": (120, {}),
        "association proj/ana GrpTRES": (None, {"node": 3}),
        "QOS 'normal' MaxWall": (24 * 60, {}),
        "QOS 'normal' MaxTRESPerUser": (None, {"gres/gpu": 16}),
    }
    cap = caps(built, PARTITION, cpus_per_node=32, gpus_per_node=4, mem_per_node_mb=None)
    # node=3 (GrpTRES) against 16 GPUs ÷ 4 per node (MaxTRESPerUser): 3; MaxWall 120 min against 1 day
    assert (cap.nodes, cap.time_min) == (3, 120)
    assert cap.nodes_by == "association proj/ana GrpTRES node=3" and cap.time_by == "association proj/ana MaxWall"


def test_check_submission_names_the_point(tmp_path):
    site = Site(partition="gpu", gpus_per_rank=1, mem_per_rank_mb=8000, time_margin_s=60)
    point = make_point(nodes=2, ranks_per_node=4, timeout_s=3600)
    planned = [(point.point_id, resources_for(point, site))]
    wall = limits(JobLimit(name="QOS 'normal' MaxWall", minutes=30))
    with pytest.raises(DdlbenchError, match=rf"point {point.point_id}: time limit 61 min is over QOS 'normal' MaxWall"):
        check_submission(planned, facts=FACTS, limits_of=lambda *key: wall)
    check_submission(planned, facts=FACTS, limits_of=lambda *key: limits())


def test_packed_allocations_are_sized_under_the_limits():
    site = Site(partition="gpu", gpus_per_rank=1, mem_per_rank_mb=8000, time_margin_s=60)
    points = [make_point(nodes=1, ranks_per_node=4, node=f"g{i}", batch_size=8 + i) for i in range(8)]
    points += [make_point(nodes=2, ranks_per_node=4)]
    planned = {point.point_id: resources_for(point, site) for point in points}
    assert pack_width(points, "auto") == 2  # the widest point: no allocation waits for the whole partition
    assert pack_width(points, "all") == 8  # asked: every pinned node at once
    tight = limits(
        JobLimit(name="QOS 'normal' MaxTRESPerJob", tres=(("gres/gpu", 16),)),
        JobLimit(name="QOS 'normal' MaxWall", minutes=90),
    )
    bounds = packing_bounds(points, planned, site, "all", limits=tight, partition=PARTITION)
    assert bounds.width == 4  # 16 GPUs ÷ 4 per node
    assert bounds.max_time_s == 90 * 60 - 60 - 60  # less the site's margin and the dispatcher's slack
    assert any("allocations of 4 node(s), not 8: QOS 'normal' MaxTRESPerJob gres/gpu=16" in n for n in bounds.notes)
    assert packing_bounds(points, planned, site, "auto", limits=limits(), partition=PARTITION).width == 2
