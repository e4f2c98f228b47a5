"""The user's SLURM limits (ddlbench.launch.limits) read from captured sacctmgr text, and submission in
waves under them (ddlbench.launch.waves) against a fake queue: no cluster needed. The same against the
real cluster: tests/test_slurm_limits.py."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from ddlbench.errors import DdlbenchError
from ddlbench.launch.limits import (
    build_limits,
    check_room,
    is_limit_refusal,
    parse_associations,
    parse_qos,
)
from ddlbench.launch.profile import ProfileOptions, write_profile
from ddlbench.launch.resources import Site
from ddlbench.launch.slurm import ClusterFacts, Partition, QueuedJob, check_resources, parse_default_account
from ddlbench.launch.waves import (
    EMPTY_QUEUE_PATIENCE_S,
    REFUSALS_WITH_EMPTY_QUEUE,
    LimitRefusal,
    QueueWatch,
    submit_in_waves,
    wait_for_jobs,
)

# `sacctmgr -nP show assoc where user=ana format=<ASSOC_FIELDS>`: ana's association in two accounts on
# two clusters, one of them limited on one partition only
ASSOCS = """\
hpc|proj|ana||20|8|||cpu=64,node=4|normal,long||||
hpc|proj|ana|gpu|5|||||||||
hpc|other|ana||2|||||normal||||
lab|proj|ana||1|||||normal||||
"""
# `sacctmgr -nP show qos format=<QOS_FIELDS>`
QOS = """\
normal|3||||||||||
long|||10||||node=2||||
"""
FACTS = ClusterFacts(
    partitions={},
    nodes={},
    associations_enforced=True,
    limits_enforced=True,
    user="ana",
    default_account="proj",
    cluster_name="hpc",
    max_array_size=1001,
    max_job_count=10000,
)


def queued(job_id: str, state: str = "PENDING", *, account: str = "proj", qos: str = "normal") -> QueuedJob:
    return QueuedJob(job_id=job_id, state=state, name="x", comment="", account=account, qos=qos)


def limits_of(**kw):
    args = dict(
        user="ana", account=None, qos=None, partition="cpu", associations=parse_associations(ASSOCS),
        qos_table=parse_qos(QOS), facts=FACTS,
    )  # fmt: skip
    return build_limits(**(args | kw))


def test_the_default_account_and_qos_set_the_limits_and_jobs_count_by_account_and_qos():
    limits = limits_of()
    assert (limits.account, limits.qos) == ("proj", "normal")  # DefaultAccount; the association's only default
    assert {limit.name: limit.value for limit in limits.submit} == {
        "MaxJobCount": 10000,
        "association proj/ana MaxSubmitJobs": 20,
        "QOS 'normal' MaxSubmitJobsPerUser": 3,
    }
    assert {limit.name: limit.value for limit in limits.running} == {"association proj/ana MaxJobs": 8}
    assert limits.grp_tres == (("association proj/ana", "cpu=64,node=4"),)
    queue = [
        queued("1"),
        queued("2_0", "RUNNING"),
        queued("2_1", "COMPLETED"),  # ended: squeue shows it for MinJobAge, it no longer counts
        queued("3", account="other"),  # another account, the same QOS: the QOS' per-user limit counts it
        queued("4", qos="long"),  # another QOS: only the association counts it
    ]
    assert limits.room(queue) == 0
    assert limits.tightest(queue).name == "QOS 'normal' MaxSubmitJobsPerUser"
    assert limits.room(queue[:2]) == 1


def test_a_named_account_qos_and_partition_choose_their_own_limits():
    gpu = limits_of(partition="gpu")
    assert "association proj/ana/gpu MaxSubmitJobs" in {limit.name for limit in gpu.submit}
    other = limits_of(account="other", qos="long")
    assert {limit.name: limit.value for limit in other.submit} == {
        "MaxJobCount": 10000,
        "association other/ana MaxSubmitJobs": 2,
        "QOS 'long' GrpSubmitJobs": 10,
    }
    assert other.grp_tres == (("QOS 'long'", "node=2"),)


def test_without_enforced_limits_only_the_controllers_count():
    loose = limits_of(facts=dataclasses.replace(FACTS, limits_enforced=False, max_job_count=None))
    assert loose.submit == () and loose.room([queued("1")]) is None
    assert loose.max_array_size == 1001


def test_sbatch_refusals_for_a_limit_are_told_from_the_others():
    for message in (
        "sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: Job violates "
        "accounting/QOS policy (job submit limit, user's size and/or time limits)",
        "sbatch: error: AssocMaxSubmitJobLimit",
        "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying",
    ):
        assert is_limit_refusal(message), message
    for message in (
        "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
        "sbatch: error: Batch job submission failed: Requested node configuration is not available",
    ):
        assert not is_limit_refusal(message), message


def test_the_default_account_is_read_and_only_a_user_without_one_is_refused():
    from ddlbench.launch.resources import resources_for
    from tests.test_resources import make_point

    assert parse_default_account("proj\n") == "proj" and parse_default_account("\n") is None
    point = make_point()
    planned = [(point.point_id, resources_for(point, Site(partition="cpu", mem_per_rank_mb=500)))]
    partition = {"cpu": Partition(name="cpu", total_nodes=4, max_time_min=None, state="UP")}
    facts = ClusterFacts(partitions=partition, nodes={}, associations_enforced=True, user="ana")
    check_resources(planned, dataclasses.replace(facts, default_account="proj"))  # sbatch charges proj
    check_resources(planned, dataclasses.replace(facts, default_account_known=False))  # sbatch decides
    check_resources(planned, dataclasses.replace(facts, associations_enforced=False))
    with pytest.raises(DdlbenchError) as refused:
        check_resources(planned, facts)
    assert "user 'ana' has no default account" in str(refused.value)
    assert "ddlbench profile slurm --account NAME" in str(refused.value)
    named = [(point.point_id, resources_for(point, Site(partition="cpu", mem_per_rank_mb=500, account="proj")))]
    check_resources(named, facts)


def test_snakemake_is_refused_more_jobs_than_the_room_left_naming_the_jobs_that_fit():
    limits = limits_of()
    check_room(jobs=100, to_run=2, limits=limits, queue=[queued("1")])  # 2 points fit in the room of 2
    with pytest.raises(DdlbenchError, match=r"leaving room for 2; run with `--jobs 2`"):
        check_room(jobs=100, to_run=6, limits=limits, queue=[queued("1")])
    with pytest.raises(DdlbenchError, match=r"MaxSubmitJobsPerUser is 3 and 3 of your jobs .* wait until some"):
        check_room(jobs=3, to_run=6, limits=limits, queue=[queued(str(i)) for i in range(3)])


def test_the_profile_holds_jobs_under_the_tightest_limit_and_says_why(tmp_path):
    (limit,) = [each for each in limits_of().submit if each.value == 3]
    config = write_profile(Site(partition="cpu"), ProfileOptions(jobs=100, queue_limit=limit), directory=tmp_path)
    assert yaml.safe_load(config.read_text())["jobs"] == 3
    assert "100 asked, held to 3 by the tightest submit limit" in config.read_text()
    assert "QOS 'normal' MaxSubmitJobsPerUser=3" in config.read_text()
    roomy = write_profile(Site(partition="cpu"), ProfileOptions(jobs=2, queue_limit=limit), directory=tmp_path)
    assert yaml.safe_load(roomy.read_text())["jobs"] == 2


class FakeQueue:
    """squeue and sbatch together: submitted jobs pend, `finish` ends the oldest ones."""

    def __init__(self, *, refuse_over: int | None = None, account: str = "proj", qos: str = "normal"):
        self.jobs: list[QueuedJob] = []
        self.refuse_over = refuse_over
        self.account, self.qos = account, qos
        self.arrays: list[int] = []
        self.peak = 0  # most jobs active at once
        self.next_id = 100

    def squeue(self) -> list[QueuedJob]:
        return list(self.jobs)

    def sbatch(self, key, items) -> list[str]:
        active = sum(job.active for job in self.jobs)
        if self.refuse_over is not None and active + len(items) > self.refuse_over:
            raise LimitRefusal("sbatch: error: QOSMaxSubmitJobPerUserLimit")
        self.peak = max(self.peak, active + len(items))
        self.next_id += 1
        ids = [f"{self.next_id}_{i}" for i in range(len(items))]
        self.jobs += [queued(job_id, account=self.account, qos=self.qos) for job_id in ids]
        self.arrays.append(len(items))
        return ids

    def start(self, count: int) -> None:
        pending = [job for job in self.jobs if job.state == "PENDING"][:count]
        self.jobs = [dataclasses.replace(job, state="RUNNING") if job in pending else job for job in self.jobs]

    def finish(self, count: int) -> None:
        active = [job for job in self.jobs if job.active][:count]
        self.jobs = [dataclasses.replace(job, state="COMPLETED") if job in active else job for job in self.jobs]


def test_arrays_are_split_at_the_room_and_the_array_size_and_the_rest_goes_in_as_jobs_end():
    fake = FakeQueue()
    limits = dataclasses.replace(limits_of(), max_array_size=2)  # room 3 (QOS), arrays of at most 2
    watch = QueueWatch(query=fake.squeue, sleep=lambda s: fake.finish(2))
    submitted = submit_in_waves(
        [("a", list(range(5))), ("b", [5, 6])], fake.sbatch, limits=lambda k: limits, watch=watch
    )
    assert sorted(submitted.values()) == list(range(7))
    assert max(fake.arrays) == 2 and sum(fake.arrays) == 7
    assert fake.arrays == [2, 1, 2, 2]  # the room of 3 filled, then refilled as jobs ended
    assert fake.peak == 3  # never more than 3 queued at once
    assert watch.calls >= 2  # waited for room at least once


def test_a_refusal_for_a_limit_is_tried_again_and_never_lost():
    # the limit read says 3, but sbatch refuses past 1 (a group limit other users' jobs fill)
    fake = FakeQueue(refuse_over=1)
    limits = limits_of()
    naps = []
    watch = QueueWatch(query=fake.squeue, sleep=lambda s: (naps.append(s), fake.finish(1)))
    submitted = submit_in_waves([("a", list(range(4)))], fake.sbatch, limits=lambda k: limits, watch=watch)
    assert sorted(submitted.values()) == [0, 1, 2, 3]
    assert fake.arrays == [1, 1, 1, 1]  # the first array of 3 was refused, then one fitted each time


def test_a_refusal_with_none_of_the_users_jobs_queued_ends_in_an_error():
    fake = FakeQueue(refuse_over=0)
    naps: list[float] = []
    watch = QueueWatch(poll_s=2, max_poll_s=10, query=fake.squeue, sleep=naps.append)
    with pytest.raises(DdlbenchError, match=r"refused \d+ times in a row over \d+ s for a limit although none of your"):
        submit_in_waves([("a", [0])], fake.sbatch, limits=lambda k: limits_of(), watch=watch)
    # not after five quick refusals (18 s): only once the pauses add up to the patience
    assert len(naps) > REFUSALS_WITH_EMPTY_QUEUE and sum(naps[:5]) < EMPTY_QUEUE_PATIENCE_S
    assert EMPTY_QUEUE_PATIENCE_S <= sum(naps) < EMPTY_QUEUE_PATIENCE_S + 10


def test_a_controller_that_counts_ended_jobs_a_while_longer_is_waited_for():
    """The test cluster under load refused five times over 18 s with none of the user's jobs queued: its
    count of queued jobs lagged squeue's. Once the count catches up, the point goes in."""
    fake = FakeQueue(refuse_over=0)
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 8:  # about 40 s after the first refusal
            fake.refuse_over = 3

    watch = QueueWatch(poll_s=2, max_poll_s=10, query=fake.squeue, sleep=sleep)
    submitted = submit_in_waves([("a", [0, 1])], fake.sbatch, limits=lambda k: limits_of(), watch=watch)
    assert sorted(submitted.values()) == [0, 1] and len(naps) == 8


def test_the_poll_interval_grows_while_nothing_ends_and_falls_back_when_a_job_ends():
    fake = FakeQueue()
    fake.sbatch("a", [0, 1, 2])
    naps: list[float] = []
    ends_at = {6: 1, 9: 2}  # after the 6th and 9th pause, jobs end

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        fake.start(1 if len(naps) in (2, 3) else 0)  # a job that starts changes nothing waited for
        fake.finish(ends_at.get(len(naps), 0))

    watch = QueueWatch(poll_s=5, max_poll_s=20, growth=1.5, query=fake.squeue, sleep=sleep)
    wait_for_jobs([job.job_id for job in fake.jobs], watch=watch)
    assert naps == [5, 7.5, 11.25, 16.875, 20, 20, 5, 7.5, 11.25]
    assert watch.calls == len(naps) + 1  # one squeue per poll, for all the jobs


def test_a_result_file_cuts_a_long_pause_short_but_never_under_the_least(tmp_path):
    import time
    from types import SimpleNamespace

    from ddlbench.launch.submission import ResultNap

    result = tmp_path / "7_0_result.pkl"
    job = SimpleNamespace(job_id="7_0", paths=SimpleNamespace(result_pickle=result))
    nap = ResultNap(lambda: [job], least_s=0.2, check_s=0.05)
    began = time.monotonic()
    nap(0.5)  # no result: the whole pause
    assert time.monotonic() - began >= 0.5
    result.write_bytes(b"")
    began = time.monotonic()
    nap(30)  # a result: back after the least pause and a moment for SLURM to end the job
    assert 0.2 <= time.monotonic() - began < 2
    began = time.monotonic()
    nap(0.4)  # that result is no longer news
    assert time.monotonic() - began >= 0.4
