"""The silent-data-corruption replay (ddlbench.train.replay) and its check across ranks and nodes
(ddlbench.certify.replay). The check run for real through certify, with a `corrupt` fault on one node of the
test cluster, is test_slurm_cluster.py's per-node certification; a clean local suite, test_certify_runs.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ddlbench.certify.certificate import build_certificate
from ddlbench.certify.replay import replay_figures
from ddlbench.records import RankResult
from ddlbench.train.faults import planned_corruption, planned_fault
from ddlbench.train.replay import replay_point
from tests.conftest import make_point
from tests.test_records import sample_record

pytestmark = pytest.mark.slow  # real replays (a few seconds): in `make test`, not again in the torch-floor venv
POINT = make_point(replay_steps=2, batch_size=4)


@pytest.fixture(scope="module")
def replays() -> dict[str, dict]:
    torch.set_num_threads(1)
    cpu = torch.device("cpu")
    return {
        "clean": replay_point(POINT, cpu),
        "again": replay_point(POINT, cpu),
        "corrupt": replay_point(POINT, cpu, corrupt=True),
    }


def test_a_replay_is_bit_repeatable_and_a_flipped_bit_shows_from_the_first_step(replays):
    clean, again, corrupt = replays["clean"], replays["again"], replays["corrupt"]
    assert clean["repeatable"] and clean["digest"] == again["digest"]  # two calls, two passes each: one answer
    assert len(clean["losses_hex"]) == len(clean["grad_sha256"]) == POINT.replay_steps
    assert clean["corrupted"] == "" and corrupt["corrupted"].startswith("bit 22 of ")
    # a stuck bit is a consistent difference: repeatable, and different from the first step's loss on
    assert corrupt["repeatable"] and corrupt["digest"] != clean["digest"]
    assert corrupt["losses_hex"][0] != clean["losses_hex"][0]
    assert corrupt["weights_sha256"] != clean["weights_sha256"]


def test_corrupt_is_looked_up_beside_the_other_faults():
    env = {"DDLBENCH_INJECT_FAULT": "slow:0.3@n1x1,corrupt@n1x1"}
    assert planned_fault("m-d-s-n1x1-b8", env) == "slow:0.3" and planned_corruption("m-d-s-n1x1-b8", env)
    assert not planned_corruption("m-d-s-n2x1-b8", env) and planned_fault("m-d-s-n2x1-b8", env) is None
    with pytest.raises(ValueError, match="corrupt"):
        planned_corruption("x", {"DDLBENCH_INJECT_FAULT": "corrupted"})


def _record(node: str, results: list[dict], point=POINT):
    """A record of one node's ranks, each with the given replay."""
    record = sample_record()
    ranks = tuple(
        RankResult(rank=r, hostname=node, step_times_s=(0.1,), losses=(2.0,), peak_rss_bytes=1, replay=result)
        for r, result in enumerate(results)
    )
    point = replace(point, nodes=1, ranks_per_node=len(results), node=node)
    return replace(record, point=point, point_id=point.point_id, ranks=ranks)


def test_the_odd_replay_is_named_with_its_node_and_rank_and_fails_the_certificate(replays):
    clean, corrupt = replays["clean"], replays["corrupt"]
    records = [_record("n1", [clean, clean]), _record("n2", [clean, corrupt])]
    figures = {figure.node: figure for figure in replay_figures(records)}
    assert set(figures) == {"n1", "n2"} and figures["n1"].name == figures["n2"].name
    assert (figures["n1"].value, figures["n1"].check) == (0, "pass")
    assert (figures["n2"].value, figures["n2"].n, figures["n2"].check) == (1, 2, "failed")
    odd = records[1]
    assert f"rank 1 of {odd.point_id} on n2" in figures["n2"].finding and "step 0's loss" in figures["n2"].finding
    certificate = build_certificate(
        list(figures.values()), None, system="s", partition="p", suite="x", config_hash="h", references_path=None
    )
    assert not certificate["passed"] and certificate["nodes_outside"] == ["n2"]
    assert [entry["status"] for entry in certificate["figures"]] == ["pass", "failed"]


def test_two_replays_that_differ_fail_without_naming_either_and_one_alone_is_not_judged(replays):
    clean, corrupt = replays["clean"], replays["corrupt"]
    tied = replay_figures([_record("n1", [clean]), _record("n2", [corrupt])])
    assert all(figure.value is None and figure.check == "failed" for figure in tied)
    assert "no majority" in tied[0].finding
    alone = replay_figures([_record("n1", [clean])])
    assert len(alone) == 1 and alone[0].check == "" and "nothing to compare" in alone[0].basis
    certificate = build_certificate(
        alone, None, system="s", partition="p", suite="x", config_hash="h", references_path=None
    )
    assert certificate["figures"][0]["status"] == "no reference" and not certificate["passed"]


def test_replays_of_other_computations_are_not_compared(replays):
    # a different batch is another computation: the corrupt replay of it has nobody to disagree with
    other = replace(POINT, batch_size=8)
    figures = replay_figures([_record("n1", [replays["clean"]] * 2), _record("n2", [replays["corrupt"]], other)])
    assert sorted((figure.name.split("-b")[1][:1], figure.check) for figure in figures) == [("4", "pass"), ("8", "")]


def test_a_device_that_disagrees_with_itself_is_named_even_with_the_majoritys_digest(replays):
    clean = replays["clean"]
    flaky = clean | {"repeatable": False}
    figures = {f.node: f for f in replay_figures([_record("n1", [clean, clean]), _record("n2", [flaky])])}
    assert figures["n2"].check == "failed" and "its own passes disagree" in figures["n2"].finding
    excused = clean | {"repeatable": False, "nondeterministic_ops": ["some_op_cuda"]}
    figures = {f.node: f for f in replay_figures([_record("n1", [clean, clean]), _record("n2", [excused])])}
    assert figures["n2"].check == "pass"
