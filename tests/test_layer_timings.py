"""Layer timings: per-block forward and backward times of real models, into the machine file."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import warnings

import pytest
import yaml

from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.machine.layer_timings import layer_timing_figures
from ddlbench.analysis.machine.machine_file import read_machine
from ddlbench.calibrate.report import render_calibration
from ddlbench.calibrate.suite import load_suite
from ddlbench.catalog import MODELS
from ddlbench.errors import ConfigError, DdlbenchError
from ddlbench.train.calibration.point import CalibrationPoint
from ddlbench.train.calibration.records import CalibrationRankResult, CalibrationRecord, read_calibration_record
from tests.conftest import run_cli

# a suite of layer timings alone: no compute point, no collectives
ONLY_TIMINGS = {"collectives": [], "matmul_sizes": [], "conv_shapes": [], "memory_bytes": 0}
RESNET8 = {"model": "resnet8", "dataset": "cifar10", "batch_sizes": [8, 2]}
GPT_TINY = {"model": "gpt_tiny", "dataset": "tokens_small", "batch_sizes": [2, 16]}


def test_layer_timings_expand_to_one_point_per_precision_on_one_node():
    suite = load_suite(
        raw=ONLY_TIMINGS | {"layer_timings": [RESNET8], "precisions": ["fp32", "bf16"], "ranks_per_node": 3}
    )
    assert [(p.benchmark, p.precisions, p.nodes, p.ranks_per_node) for p in suite.points] == [
        ("layer_timings", ("fp32",), 1, 3),
        ("layer_timings", ("bf16",), 1, 3),
    ]
    point = suite.points[0]
    assert point.model_options == (("norm", "batch"),)  # the model's default filled in
    assert point.batch_sizes == (2, 8)
    assert point.point_id.startswith("layer_timings-resnet8-cifar10-fp32-n1x3-t1-")
    assert CalibrationPoint.from_dict(json.loads(point.to_json())) == point
    # other points' specs do not carry the layer timings' fields, so they keep the ids they had before
    compute = load_suite(raw={"collectives": []}).points[0]
    assert compute.benchmark == "compute" and "model" not in json.loads(compute.to_json())


def test_example_suite_of_layer_timings_alone(repo):
    suite = load_suite(repo / "workflow" / "calibration" / "layer_timings.yaml")
    assert {p.benchmark for p in suite.points} == {"layer_timings"}
    assert [p.model for p in suite.points] == ["resnet8", "resnet18", "gpt_tiny"]


def test_machine_files_layer_timings_are_read_without_torch():
    code = "import sys, ddlbench.analysis.machine.layer_timings; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_bad_layer_timings_name_the_value_and_the_choices():
    with pytest.raises(ConfigError, match=r"layer_timings\[0\].model: \"resnet9\" is not one of .*resnet8"):
        load_suite(raw={"layer_timings": [RESNET8 | {"model": "resnet9"}]})
    with pytest.raises(
        ConfigError, match=r"layer_timings\[0\].dataset: 'tokens' gives tokens input; resnet8 takes image2d"
    ):
        load_suite(raw={"layer_timings": [RESNET8 | {"dataset": "tokens"}]})
    with pytest.raises(
        ConfigError, match=r"layer_timings\[0\].options.norm: 'layer' is not accepted: choose from: batch"
    ):
        load_suite(raw={"layer_timings": [RESNET8 | {"options": {"norm": "layer"}}]})
    with pytest.raises(ConfigError, match=r"layer_timings\[0\].options.stem: 'stem' is not an option of resnet8"):
        load_suite(raw={"layer_timings": [RESNET8 | {"options": {"stem": "cifar"}}]})
    with pytest.raises(ConfigError, match=r"layer_timings\[0\].batch_sizes: .* too few entries; give at least 2"):
        load_suite(raw={"layer_timings": [RESNET8 | {"batch_sizes": [8]}]})
    with pytest.raises(ConfigError, match="the suite measures nothing"):
        load_suite(raw=ONLY_TIMINGS)


def _rank(rank: int, steps: dict[int, float]) -> CalibrationRankResult:
    """A rank whose every part takes a fixed share of a step of `steps[batch]` seconds, plus `rank` µs."""
    measurements = [
        {
            "kind": "layer_timings",
            "precision": "fp32",
            "batch_size": batch,
            "blocks": [
                {"name": "Conv", "forward_s": [0.2 * step + rank * 1e-6] * 3, "backward_s": [0.4 * step] * 3},
                {"name": "Head", "forward_s": [0.1 * step] * 3, "backward_s": [0.1 * step] * 3},
            ],
            "loss_s": [0.05 * step] * 3,
            "update_s": [0.01 * (1 + rank)] * 3,
            "step_s": [step] * 3,
            "other_s": [0.15 * step - 0.01] * 3,
        }
        for batch, step in steps.items()
    ]
    return CalibrationRankResult(
        rank=rank,
        hostname="h",
        device="cpu",
        device_name="",
        backend="gloo",
        library="gloo",
        torch_version="2.13",
        threads=1,
        cpus=(rank,),
        measurements=tuple(measurements),
    )


def test_layer_timing_figures_pool_the_ranks_steps_and_fit_a_line_per_block():
    point = load_suite(raw=ONLY_TIMINGS | {"layer_timings": [RESNET8], "precisions": ["fp32"]}).points[0]
    steps = {2: 0.1, 8: 0.4}  # 0.05 s per sample through the origin
    ranks = (_rank(0, steps), _rank(1, steps))
    record = CalibrationRecord(
        point_id=point.point_id, point=point, status="ok", reason=None, launcher="local", start_time="", end_time="",
        ranks=ranks,
    )  # fmt: skip
    timings = layer_timing_figures(record)
    assert timings["batch_sizes"] == [2, 8] and timings["ranks_per_node"] == 2 and timings["threads"] == 1
    conv = timings["blocks"][0]
    assert [figure["n"] for figure in conv["forward_s"]] == [6, 6]  # 2 ranks × 3 steps, pooled
    assert conv["forward_s"][1]["value"] == pytest.approx(0.2 * 0.4 + 0.5e-6)  # the median of the pooled steps
    assert conv["backward_fit"]["alpha_s"] == pytest.approx(0, abs=1e-12)
    assert conv["backward_fit"]["beta_s_per_sample"] == pytest.approx(0.4 * 0.05)
    assert timings["update_s"]["value"] == pytest.approx(0.015) and timings["update_s"]["n"] == 12  # all sizes
    assert timings["loss_fit"]["beta_s_per_sample"] == pytest.approx(0.05 * 0.05)


def _valid_machine() -> dict:
    figure = {"value": 0.01, "ci_low": None, "ci_high": None, "n": 3}
    fit = {"alpha_s": 0.001, "beta_s_per_sample": 1e-4}
    block = {"name": "Conv", "forward_s": [figure, figure], "backward_s": [figure, figure]}
    timings = {
        "model": "resnet8",
        "dataset": "cifar10",
        "options": {"norm": "batch"},
        "precision": "fp32",
        "threads": 1,
        "ranks_per_node": 2,
        "batch_sizes": [2, 8],
        "blocks": [block | {"forward_fit": fit, "backward_fit": fit}, block],
        "loss_s": [figure, figure],
        "loss_fit": fit,
        "update_s": figure,
        "step_s": [figure, figure],
    }
    machine = {"machine_version": 1, "name": "x", "source": "measured", "device": {}, "compute": {}, "links": {}}
    return json.loads(json.dumps(machine | {"collectives": [], "layer_timings": [timings]}))  # nothing shared


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (lambda p: p["blocks"][1]["forward_s"].pop(), r"layer_timings\[0\].blocks\[1\].forward_s has 1 figure"),
        (lambda p: p.pop("update_s"), r"layer_timings\[0\] lacks update_s"),
        (lambda p: p.update(batch_sizes=[8]), r"layer_timings\[0\].batch_sizes is \[8\]: give at least 2"),
        (lambda p: p["blocks"][0]["backward_fit"].pop("alpha_s"), r"blocks\[0\].backward_fit is .*numeric alpha_s"),
        (lambda p: p["step_s"][1].update(value="0.5"), r"layer_timings\[0\].step_s\[1\].value is '0.5', not a number"),
        (lambda p: p.update(blocks=[]), r"layer_timings\[0\].blocks is \[\]: give one mapping per block"),
    ],
)
def test_read_machine_rejects_malformed_layer_timings(tmp_path, break_it, message):
    path = tmp_path / "m.yaml"
    machine = _valid_machine()
    path.write_text(yaml.safe_dump(machine))
    assert read_machine(path)["layer_timings"][0]["model"] == "resnet8"
    break_it(machine["layer_timings"][0])
    path.write_text(yaml.safe_dump(machine))
    with pytest.raises(DdlbenchError, match=message):
        read_machine(path)


def test_report_has_a_table_per_timed_model():
    machine = _valid_machine() | {"hosts": ["h"], "device": {"kind": "cpu", "name": "c", "threads_per_rank": 1}}
    machine |= {"measured_at": "now", "ddlbench_version": "0", "git_commit": None, "suite": "s", "cpu_model": "c"}
    machine |= {"torch_version": "2.13", "failed_points": []}
    html = render_calibration(machine)
    assert "resnet8 on cifar10 (norm=batch), fp32, 2 rank(s) at once × 1 thread(s)" in html
    assert html.count("<td>200.0%</td>") == 4  # each block at each batch size: (0.01 + 0.01) ÷ 0.01


def test_the_first_blocks_backward_is_timed_without_torchs_full_hook_warning():
    # block 0's input needs no gradient (images, token ids): a full backward hook on it would fire at its
    # start, with a warning; the kernel times it from its output's gradient to backward()'s return
    import torch

    from ddlbench.train.calibration.layer_timing_kernel import run_layer_timings

    point = load_suite(raw=ONLY_TIMINGS | {"layer_timings": [GPT_TINY | {"batch_sizes": [1, 2]}]}).points[0]
    point = CalibrationPoint.from_dict(json.loads(point.to_json()) | {"warmup": 1, "iterations": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (small, _) = run_layer_timings(point, torch.device("cpu"))
    embedding = small["blocks"][0]
    assert embedding["name"] == "Embedding" and min(embedding["backward_s"]) > 0
    assert min(small["other_s"]) >= 0  # the parts are disjoint intervals of the step


def test_a_spell_of_load_falls_on_every_batch_size_alike(monkeypatch):
    # A spell of load, SPELL_S a step over a third of the timed steps in a row, as a neighbour busy for a while
    # would add: the batch sizes are timed in rounds, so each takes an equal share of it and its median step
    # keeps clear of it. Timed one batch size after the other, the middle one took the whole spell.
    # The spell moves the kernel's clock on rather than sleeping, so it can dwarf any real load on the test
    # machine (CI once stretched resnet8's unslowed steps from 3-15 ms to 170 ms) and costs nothing.
    import time
    import types
    from collections import Counter

    import torch

    from ddlbench.train.calibration import layer_timing_kernel

    SPELL_S, ITERATIONS, BATCHES = 1000.0, 9, [1, 2, 4]
    warmup = len(BATCHES)  # one untimed step per batch size
    spell = range(warmup + ITERATIONS, warmup + 2 * ITERATIONS)  # the second third of the timed steps
    calls = iter(range(10**6))
    slept: Counter[int] = Counter()  # batch size → steps slowed
    lost = [0.0]  # seconds the spell has added to the kernel's clock
    monkeypatch.setattr(
        layer_timing_kernel, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + lost[0])
    )
    build = layer_timing_kernel.build_timed_model

    def slowed(*args):
        model = build(*args)

        def load(_module, inputs):
            if next(calls) in spell:
                slept[inputs[0].shape[0]] += 1
                lost[0] += SPELL_S

        model[0].register_forward_pre_hook(load)
        return model

    monkeypatch.setattr(layer_timing_kernel, "build_timed_model", slowed)
    point = load_suite(raw=ONLY_TIMINGS | {"layer_timings": [RESNET8 | {"batch_sizes": BATCHES}]}).points[0]
    point = CalibrationPoint.from_dict(json.loads(point.to_json()) | {"warmup": 1, "iterations": ITERATIONS})
    entries = layer_timing_kernel.run_layer_timings(point, torch.device("cpu"))
    assert [entry["batch_size"] for entry in entries] == BATCHES
    assert slept == {batch: ITERATIONS // 3 for batch in BATCHES}  # one after the other: {2: 9}
    for entry in entries:
        steps = entry["step_s"]
        assert len(steps) == ITERATIONS and sum(t > SPELL_S for t in steps) == ITERATIONS // 3  # the slowed ones
        # the median (the 5th of 9, 3 slowed) is an unslowed step: far below the spell
        assert statistics.median(steps) < SPELL_S / 2, (entry["batch_size"], steps)


@pytest.mark.slow
def test_calibrate_writes_layer_timings_from_real_runs(tmp_path):
    suite = ONLY_TIMINGS | {
        "name": "timed",
        "results_dir": str(tmp_path / "results"),
        "precisions": ["fp32"],
        "ranks_per_node": 2,
        "layer_timings": [RESNET8, GPT_TINY],
        "warmup": 1,
        "iterations": 4,
        "oversubscribe": True,
    }
    out = tmp_path / "machine.yaml"
    ran = run_cli("calibrate", "--config-json", json.dumps(suite), "--out", str(out))
    assert ran.returncode == 0, ran.stderr[-3000:]
    machine = read_machine(out)
    assert machine["failed_points"] == [] and machine["collectives"] == [] and machine["compute"] == {}
    resnet, gpt = machine["layer_timings"]
    assert resnet["options"] == {"norm": "batch"} and gpt["options"] == {}
    for timings in (resnet, gpt):
        assert timings["batch_sizes"] == sorted(timings["batch_sizes"]) and len(timings["batch_sizes"]) == 2
        assert timings["ranks_per_node"] == 2 and timings["threads"] == 1
        assert len(timings["blocks"]) == MODELS.get(timings["model"]).blocks  # one per top-level child
        record = read_calibration_record(
            tmp_path / "results" / "timed" / "calibration" / "points" / timings["point_id"] / "record.json"
        )
        for rank in record.ranks:
            for entry in rank.measurements:
                # a step's parts are disjoint intervals inside it, so what they leave out is never negative;
                # it is the gaps between hooks, autocast's entry and Python between the marks: ~1 ms of
                # 15-50 ms steps here (1-5 %; up to 20 % in a step preempted in a gap), hence 0.7
                assert min(entry["other_s"]) >= 0
                covered = [1 - other / step for other, step in zip(entry["other_s"], entry["step_s"], strict=True)]
                assert 0.7 <= statistics.median(covered) <= 1, (timings["model"], rank.rank, covered)
        for size in range(2):
            step = timings["step_s"][size]
            assert step["n"] == 2 * 4  # both ranks' timed steps, pooled
            pooled = [t for rank in record.ranks for t in rank.measurements[size]["step_s"]]
            assert step["value"] == pytest.approx(statistics.median(pooled), rel=1e-12)
            # The medians of the parts add up to about the median step, but not as tightly as each step's
            # parts do (checked above): each median is taken alone over both ranks' steps pooled, and on a
            # shared 2-core machine one rank's steps can take twice the other's (seen: 0.65 under load 5;
            # 0.46 in a CI run, with the step's own 95 % interval [0.0086, 0.026] s around 0.016 s), so the
            # bound is a loose one taken against the step's interval, not its median alone; on a quiet
            # machine the ratio is 0.93-1.05.
            parts = sum(b["forward_s"][size]["value"] + b["backward_s"][size]["value"] for b in timings["blocks"])
            parts += timings["loss_s"][size]["value"] + timings["update_s"]["value"]
            low, high = step["ci_low"] or step["value"], step["ci_high"] or step["value"]
            assert 0.5 * low <= parts <= 1.25 * high, (timings["model"], size, parts, step)
        heaviest = max(timings["blocks"], key=lambda block: block["forward_s"][1]["value"])
        # 4× (8×) the samples: ~3× (~2.5×) the time on this machine. Load only adds time, and under xdist's
        # load one batch's median came out above the other's (5.1 ms, interval [0.9, 11], against 3.2):
        # the fastest of each batch's 8 timed calls (both ranks) is what the gap shows through
        index = timings["blocks"].index(heaviest)
        fastest: dict[int, float] = {}
        for rank in record.ranks:
            for entry in rank.measurements:
                times = entry["blocks"][index]["forward_s"]
                fastest[entry["batch_size"]] = min(fastest.get(entry["batch_size"], math.inf), *times)
        small, large = sorted(fastest)
        assert fastest[large] > fastest[small], (timings["model"], fastest)
        assert heaviest["forward_fit"]["beta_s_per_sample"] > 0
    report = (tmp_path / "results" / "timed" / "calibration" / "report.html").read_text()
    assert "resnet8 on cifar10" in report and "gpt_tiny on tokens_small" in report


def test_a_suite_with_the_old_key_is_refused_naming_the_new_one(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(ONLY_TIMINGS | {"profiles": [RESNET8]}))
    refused = run_cli("calibrate", "--configfile", str(path), "--out", str(tmp_path / "machine.yaml"))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "ddlbench: error: profiles: this key is now layer_timings (the same entries); rename it"
    ]


def test_a_machine_file_written_with_the_old_key_still_reads(tmp_path):
    machine = _valid_machine()
    machine["layer_profiles"] = machine.pop("layer_timings")
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(machine))
    assert read_machine(path)["layer_timings"][0]["model"] == "resnet8"
    assert MachineModel.from_file(path).layer_timings[0].model == "resnet8"
