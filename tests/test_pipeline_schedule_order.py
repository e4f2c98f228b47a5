"""Pipeline schedules told apart by what they do, not by the name the trainer reports about itself.

GPipe and 1F1B compute the same numbers, so the equivalence tests cannot tell them apart. What differs is
the order in which a stage runs micro-batches forward and backward, and so how many it holds at once:
the stage modules' own hooks record it during the first step (ddlbench.train.strategies.pipeline's
ActionRecorder), and the facts carry it.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from ddlbench.launch.runner import run_point
from ddlbench.train.strategies.pipeline import ActionRecorder
from tests.equivalence import layout_point

MICRO_BATCHES = 4
STAGES = 2  # ranks; interleaved 1F1B holds two stages on each


def test_recorder_ties_each_backward_to_its_forward_and_counts_what_is_in_flight():
    stage = nn.Linear(3, 3)
    recorder = ActionRecorder([(0, stage)])
    outputs = [stage(torch.randn(2, 3)) for _ in range(3)]
    outputs[1].sum().backward()  # out of order: the B names the forward it undoes, not a count
    outputs[0].sum().backward()
    outputs[2].sum().backward()
    recorder.stop()
    stage(torch.randn(2, 3)).sum().backward()  # after stop: not recorded
    assert recorder.sequence() == recorder.sequence(0) == "F0 F1 F2 B1 B0 B2"
    assert recorder.peak_in_flight() == 3


@pytest.fixture(scope="module")
def facts_by_schedule(tmp_path_factory) -> dict[str, list[dict]]:
    """Each schedule's per-rank facts from one real 2-rank run (resnet8, 4 micro-batches)."""
    found = {}
    for strategy in ("gpipe", "1f1b", "interleaved_1f1b"):
        point = layout_point(
            strategy=strategy,
            nodes=1,
            ranks_per_node=STAGES,
            micro_batches=MICRO_BATCHES,
            batch_size=8,
            warmup_steps=1,
            steps=1,
            model_options=(("norm", "group"),),
        )
        record = run_point(point, out=tmp_path_factory.mktemp(strategy) / "record.json", launcher="local")
        assert record.status == "ok", record.reason
        found[strategy] = [rank.facts for rank in record.ranks]
    return found


def _forwards_then_backwards(actions: str) -> bool:
    kinds = [action[0] for action in actions.split()]
    return kinds == ["F"] * MICRO_BATCHES + ["B"] * MICRO_BATCHES


@pytest.mark.slow
def test_gpipe_runs_every_forward_before_any_backward_on_every_stage(facts_by_schedule):
    for facts in facts_by_schedule["gpipe"]:
        assert _forwards_then_backwards(facts["observed_actions"]), facts["observed_actions"]
        assert facts["peak_in_flight_micro_batches"] == MICRO_BATCHES


@pytest.mark.slow
def test_1f1b_interleaves_and_holds_at_most_as_many_micro_batches_as_stages(facts_by_schedule):
    first, last = facts_by_schedule["1f1b"]
    assert first["peak_in_flight_micro_batches"] == STAGES
    assert last["peak_in_flight_micro_batches"] == 1  # the last stage runs each backward right after its forward
    for facts in (first, last):
        actions = facts["observed_actions"].split()
        assert sorted(actions) == sorted(f"{kind}{mb}" for kind in "FB" for mb in range(MICRO_BATCHES))
        # interleaved: a backward comes before the last forward
        assert actions.index("B0") < actions.index(f"F{MICRO_BATCHES - 1}"), actions


@pytest.mark.slow
def test_interleaved_1f1b_runs_two_stages_per_rank_in_an_order_of_its_own(facts_by_schedule):
    interleaved = facts_by_schedule["interleaved_1f1b"]
    for rank, facts in enumerate(interleaved):
        by_stage = facts["observed_actions_by_stage"]
        assert sorted(by_stage) == [str(rank), str(rank + STAGES)]  # looped placement
        assert all(len(actions.split()) == 2 * MICRO_BATCHES for actions in by_stage.values())
        # the rank goes back and forth between its stages within the step, not one stage after the other
        stages = [action.partition("@")[2] for action in facts["observed_actions"].split()]
        assert sum(a != b for a, b in itertools.pairwise(stages)) > 1, facts["observed_actions"]
        # and, over its two stages, starts backwards before all forwards are done
        kinds = _kinds(facts["observed_actions"])
        assert kinds.index("B") < kinds.rindex("F"), facts["observed_actions"]
    # what the ranks hold at once differs from both single-stage schedules' (measured: 5 and 3 here)
    peaks = {
        name: [f["peak_in_flight_micro_batches"] for f in facts_by_schedule[name]]
        for name in ("gpipe", "1f1b", "interleaved_1f1b")
    }
    assert peaks["gpipe"] == [MICRO_BATCHES, MICRO_BATCHES] and peaks["1f1b"] == [STAGES, 1]
    assert peaks["interleaved_1f1b"] not in (peaks["gpipe"], peaks["1f1b"]), peaks


def _kinds(actions: str) -> str:
    """The sequence of F and B alone: what the schedule decides, whatever the labels."""
    return "".join(action[0] for action in actions.split())
