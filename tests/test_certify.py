"""`ddlbench certify` judges figures against reference bands, per node too; `history` and `compare` keep
and set side by side every run. Records here are written by hand (tests/test_aggregate.py's helpers), so
every figure is known exactly; the real runs are in test_certify_runs.py and test_slurm_cluster.py."""

from __future__ import annotations

import json
import sqlite3
import statistics

import pytest
import yaml

from ddlbench.certify.certificate import judge
from ddlbench.certify.references import load_references, parse_references
from ddlbench.cli import main
from ddlbench.cli.certify import render_certificate
from ddlbench.errors import ConfigError
from ddlbench.history.db import list_runs, load_run
from ddlbench.history.figures import Figure
from ddlbench.history.store import store_certificate
from ddlbench.records import MEASUREMENT_VERSION
from tests.test_aggregate import plan_of, record_for, write

NODES = ["n1", "n2", "n3"]
ONE = "train/resnet8-cifar10-ddp-n1x1-b32-t1/samples_per_s"
TWO = "train/resnet8-cifar10-ddp-n2x1-b32-t1/samples_per_s"
EFFICIENCY = "scaling/resnet8-cifar10-ddp-n2x1-b32-t1/efficiency"


def steps_around(value: float, spread: float = 0.01) -> tuple[float, ...]:
    """Eight step throughputs whose median is `value` (an interval needs n ≥ 6)."""
    return tuple(value * (1 + spread * k / 4) for k in (-4, -3, -2, -1, 1, 2, 3, 4))


def subset(expected: dict, actual: dict) -> bool:
    return {key: actual.get(key) for key in expected} == expected


def sweep_records(tmp_path, per_node: dict[str, float], two_nodes: float, name: str = "agg", repetitions: int = 1):
    """A sweep folder whose single-node point ran on each node of `per_node`, plus a 2-node point; each
    `repetitions` times, the launches 1 samples/s apart around the value."""
    plan = plan_of(tmp_path / name, strategies=["ddp"], nodes=[1, 2], each_node=list(per_node), repetitions=repetitions)
    records = []
    for point in plan.points:
        value = (per_node[point.node] if point.node else two_nodes) + point.repetition - (repetitions - 1) / 2
        records.append(record_for(point, value, steps=steps_around(value)))
    write(plan, records)
    return plan.config.sweep_dir


def references(tmp_path, figures: dict[str, object], system: str = "lab:cpu") -> str:
    path = tmp_path / "refs.yaml"
    path.write_text(yaml.safe_dump({"references_version": 1, "systems": {system: figures}}))
    return str(path)


def certify(tmp_path, folder, refs: str, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "certificate.json"
    db = tmp_path / "history.sqlite"
    args = ["-q", "certify", "--system", "lab", "--partition", "cpu", "--references", refs]
    code = main([*args, "--from-records", str(folder), "--json", str(out), "--db", str(db), *extra])
    return code, json.loads(out.read_text()) if out.exists() and code != 2 else {}


# references


def test_tolerances_are_fractions_of_the_value_and_bounds_are_absolute():
    parsed = parse_references(
        {
            "systems": {
                "a:b": {
                    "rel": {"value": 200.0, "lower": -0.1, "upper": 0.25, "unit": "samples/s"},
                    "reframe": [50, -0.2, None, "GB/s"],
                    "abs": {"min": 3, "max": 7, "unit": "s"},
                }
            }
        },
        source="inline",
    ).for_partition("a", "b")
    assert (parsed["rel"].low, parsed["rel"].high) == (180.0, 250.0)
    assert (parsed["reframe"].low, parsed["reframe"].high) == (40.0, None)
    assert parsed["reframe"].holds(1e9) and not parsed["reframe"].holds(39.9)
    assert parsed["abs"].holds(3) and parsed["abs"].holds(7) and not parsed["abs"].holds(7.01)
    assert parsed["rel"].deviation(190.0) == pytest.approx(-0.05)
    assert parsed["abs"].deviation(5) is None  # no reference value: no deviation


@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"value": 1, "lower": 0.1, "unit": "s"}, "systems.a:b.f.lower"),
        ({"value": 1, "upper": -0.1, "unit": "s"}, "systems.a:b.f.upper"),
        ({"value": 1, "lower": -0.1}, "systems.a:b.f.unit"),
        ({"value": 1, "lower": -0.1, "unit": "s", "tolerance": 3}, "systems.a:b.f.tolerance"),
        ({"value": 1, "lower": -0.1, "min": 0, "unit": "s"}, "systems.a:b.f"),
        ({"value": "fast", "lower": -0.1, "unit": "s"}, "systems.a:b.f.value"),
        ({"min": 5, "max": 1, "unit": "s"}, "systems.a:b.f.min"),
        ({"value": 1, "unit": "s"}, "systems.a:b.f"),
        ([1, -0.1, "s"], "systems.a:b.f"),
    ],
)
def test_a_malformed_reference_is_refused_with_its_key(entry, key):
    with pytest.raises(ConfigError) as caught:
        parse_references({"systems": {"a:b": {"f": entry}}}, source="refs.yaml")
    assert caught.value.key == key


def test_an_unknown_system_or_partition_is_refused_naming_the_known_ones(tmp_path):
    refs = load_references(references(tmp_path, {ONE: [1, -0.1, 0.1, "samples/s"]}, system="lab:gpu"))
    with pytest.raises(ConfigError, match=r"'other' has no references.*systems there: lab"):
        refs.for_partition("other", "gpu")
    with pytest.raises(ConfigError, match=r"'cpu' has no references for system 'lab'.*its partitions: gpu"):
        refs.for_partition("lab", "cpu")


def test_a_pass_is_certain_only_when_the_whole_interval_is_inside_the_band():
    ref = parse_references({"systems": {"a:b": {"f": [100, -0.1, 0.1, "u"]}}}, source="x").for_partition("a", "b")["f"]

    def figure(value, low, high):
        return Figure(name="f", unit="u", kind="throughput", value=value, ci_low=low, ci_high=high, n=8, basis="")

    assert subset({"status": "pass", "passed": True, "certain": True}, judge(figure(95, 91, 99), ref))
    assert judge(figure(95, 85, 99), ref)["certain"] is False  # within the noise of the lower bound
    assert subset({"status": "slow", "passed": False, "certain": True}, judge(figure(80, 70, 85), ref))
    assert judge(figure(95, None, None), ref)["certain"] is None
    crashed = Figure.unmeasured("f", unit="u", kind="throughput", why="no successful repetition (failed)")
    assert subset({"status": "failed", "passed": False}, judge(crashed, ref))
    absent = Figure.unmeasured("f", unit="u", kind="throughput", why="no record", never_ran=True)
    assert subset({"status": "missing", "passed": False}, judge(absent, ref))
    assert subset({"status": "no reference", "passed": None}, judge(figure(95, 91, 99), None))


# certificates from records


def test_per_node_certification_names_the_node_outside_its_band(tmp_path):
    folder = sweep_records(tmp_path, {"n1": 100.0, "n2": 104.0, "n3": 60.0}, two_nodes=180.0)
    refs = references(tmp_path, {ONE: {"value": 100.0, "lower": -0.2, "upper": 0.2, "unit": "samples/s"}})
    code, cert = certify(tmp_path, folder, refs)
    assert code == 1 and cert["passed"] is False
    assert cert["nodes_outside"] == ["n3"]
    by_key = {(f["name"], f["node"]): f for f in cert["figures"]}
    partition = by_key[(ONE, None)]
    assert partition["value"] == pytest.approx(statistics.median([100.0, 104.0, 60.0]))
    assert partition["n"] == 3 and partition["passed"] is True  # the partition's median is fine
    assert by_key[(ONE, "n3")]["passed"] is False and by_key[(ONE, "n3")]["deviation"] == pytest.approx(-0.4)
    assert by_key[(ONE, "n1")]["passed"] is True and by_key[(ONE, "n2")]["passed"] is True
    # unreferenced figures are listed, never as passes
    assert by_key[(TWO, None)]["status"] == "no reference" and by_key[(TWO, None)]["passed"] is None
    # efficiency = T(2) / T(1) / 2, with T(1) the partition's median over nodes
    assert by_key[(EFFICIENCY, None)]["value"] == pytest.approx(180.0 / 100.0 / 2)
    for entry in cert["figures"]:
        assert {"name", "unit", "value", "ci_low", "ci_high", "reference", "lower", "upper", "deviation"} <= set(entry)
    assert by_key[(ONE, "n1")]["ci_low"] < 100.0 < by_key[(ONE, "n1")]["ci_high"]
    assert (folder / "certificate.json").exists() and "n3" in (folder / "certificate.html").read_text()


def test_every_referenced_figure_within_its_band_passes(tmp_path):
    folder = sweep_records(tmp_path, {"n1": 100.0, "n2": 98.0}, two_nodes=190.0)
    refs = references(
        tmp_path,
        {
            ONE: {"value": 100.0, "lower": -0.1, "upper": 0.1, "unit": "samples/s"},
            TWO: {"min": 150.0, "unit": "samples/s"},
            EFFICIENCY: [0.9, -0.1, None, "1"],
        },
    )
    code, cert = certify(tmp_path, folder, refs)
    assert code == 0 and cert["passed"] is True and cert["nodes_outside"] == []
    assert cert["counts"]["pass"] == 6  # 3 partition figures + 2 nodes + the nodes' spread (2 %)
    assert cert["counts"]["slow"] == cert["counts"]["failed"] == cert["counts"]["missing"] == 0


def test_a_failed_point_fails_its_reference_with_the_cause(tmp_path):
    plan = plan_of(tmp_path / "s", strategies=["ddp"], nodes=[1, 2])
    write(
        plan, [record_for(plan.points[0], 100.0, steps=steps_around(100.0)), record_for(plan.points[1], status="oom")]
    )
    refs = references(tmp_path, {TWO: [150.0, -0.1, 0.1, "samples/s"]})
    code, cert = certify(tmp_path, plan.config.sweep_dir, refs)
    entry = next(f for f in cert["figures"] if f["name"] == TWO)
    assert code == 1 and entry["status"] == "failed" and "oom" in entry["why_missing"]


def test_a_referenced_figure_the_run_never_produced_is_missing_and_fails(tmp_path, capsys):
    """A reference to a figure of a family the suite produces, but that no point produced (a configuration
    that did not run): `missing`, which fails safe; the one-line summary names it."""
    folder = sweep_records(tmp_path, {"n1": 100.0}, two_nodes=180.0)
    absent = "train/resnet8-cifar10-ddp-n4x1-b32-t1/samples_per_s"
    refs = references(tmp_path, {ONE: [100.0, -0.2, 0.2, "samples/s"], absent: [300.0, -0.2, 0.2, "samples/s"]})
    code, cert = certify(tmp_path, folder, refs)
    entry = next(f for f in cert["figures"] if f["name"] == absent)
    assert code == 1 and cert["passed"] is False
    assert entry["status"] == "missing" and entry["value"] is None and entry["passed"] is False
    assert cert["counts"]["missing"] == 1 and cert["counts"]["pass"] >= 1
    assert f"missing: {absent}" in capsys.readouterr().out


def test_a_planned_point_that_left_no_record_is_missing_not_failed(tmp_path):
    """Read from its records the run has no figure of that point (`missing`); planned, its table row says
    `missing` and its figure is one that never ran, judged the same."""
    from ddlbench.analysis.aggregate import build_table
    from ddlbench.history.figures import training_figures

    plan = plan_of(tmp_path / "s", strategies=["ddp"], nodes=[1, 2])
    write(plan, [record_for(plan.points[0], 100.0, steps=steps_around(100.0))])  # the 2-node point never ran
    refs = references(tmp_path, {TWO: [150.0, -0.1, 0.1, "samples/s"]})
    code, cert = certify(tmp_path, plan.config.sweep_dir, refs)
    entry = next(f for f in cert["figures"] if f["name"] == TWO)
    assert code == 1 and entry["status"] == "missing" and entry["value"] is None
    planned = {figure.name: figure for figure in training_figures(build_table(plan))}
    assert planned[TWO].never_ran and "never ran" in planned[TWO].why_missing
    assert judge(planned[TWO], load_references(refs).for_partition("lab", "cpu")[TWO])["status"] == "missing"


@pytest.mark.parametrize(
    ("figures", "system", "partition", "needle"),
    [
        ({"trian/nosuchmodel/samples_per_s": [1, -0.1, 0.1, "samples/s"]}, "lab", "cpu", "trian/nosuchmodel"),
        ({ONE: [1, -0.1, 0.1, "samples/s"]}, "elsewhere", "cpu", "--system"),
        ({ONE: [1, -0.1, 0.1, "samples/s"]}, "lab", "gpu", "--partition"),
        ({ONE: [1, 0.5, 0.1, "samples/s"]}, "lab", "cpu", f"{ONE}.lower"),
    ],
)
def test_bad_input_exits_2_with_one_line_naming_the_key(tmp_path, capsys, figures, system, partition, needle):
    folder = sweep_records(tmp_path, {"n1": 100.0}, two_nodes=180.0)
    refs = references(tmp_path, figures)
    args = ["-q", "certify", "--system", system, "--partition", partition, "--references", refs]
    code = main([*args, "--from-records", str(folder), "--db", str(tmp_path / "h.sqlite")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and "\n" not in err and "Traceback" not in err
    assert not (folder / "certificate.json").exists()


def test_a_malformed_reference_file_exits_2(tmp_path, capsys):
    folder = sweep_records(tmp_path, {"n1": 100.0}, two_nodes=180.0)
    bad = tmp_path / "bad.yaml"
    bad.write_text("systems: {lab:cpu: [unclosed\n")
    code = main(
        [
            "-q",
            "certify",
            "--system",
            "lab",
            "--partition",
            "cpu",
            "--references",
            str(bad),
            "--from-records",
            str(folder),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--references" in err and "not valid YAML" in err and "\n" not in err


def test_proposed_references_certify_the_run_they_came_from_and_catch_a_slower_one(tmp_path):
    folder = sweep_records(tmp_path, {"n1": 100.0, "n2": 101.0}, two_nodes=190.0)
    proposed = tmp_path / "proposed.yaml"
    args = ["-q", "certify", "--system", "lab", "--partition", "cpu", "--from-records", str(folder)]
    assert main([*args, "--write-references", str(proposed), "--db", str(tmp_path / "h.sqlite")]) == 1  # no refs yet
    refs = load_references(proposed).for_partition("lab", "cpu")
    assert refs[ONE].value == pytest.approx(100.5) and refs[ONE].lower <= -0.10  # at least ±10 % by default
    assert all(ref.unit for ref in refs.values()) and not any("@" in name for name in refs)
    code, cert = certify(tmp_path, folder, str(proposed))
    assert code == 0 and cert["passed"] is True
    slower = sweep_records(tmp_path, {"n1": 80.0, "n2": 81.0}, two_nodes=150.0, name="slower")
    code, cert = certify(tmp_path, slower, str(proposed))
    assert code == 1 and ONE in {f["name"] for f in cert["figures"] if f["status"] == "slow"}


def test_certificate_html_escapes_names_from_references_and_records():
    figure = Figure(
        name="train/<img src=x onerror=alert(1)>/samples_per_s", unit="samples/s", kind="throughput",
        value=1.0, ci_low=None, ci_high=None, n=1, basis="</td><script>alert(2)</script>", node="<b>n1</b>",
    )  # fmt: skip
    cert = {
        "system": "<i>lab</i>", "partition": "cpu", "passed": False, "suite": "s", "date": "d", "ddlbench_version": "v",
        "measurement_version": 4, "config_hash": "0" * 16, "references": "<x>.yaml", "counts": {"fail": 1},
        "nodes_outside": ["<b>n1</b>"], "regressions": [], "nodes": [], "notes": ["<u>note</u>"],
        "figures": [judge(figure, None)], "history_run": 7,
    }  # fmt: skip
    html = render_certificate(cert)
    for markup in ("<img src=x", "<script>alert(2)", "<b>n1</b>", "<i>lab</i>", "<u>note</u>", "<x>.yaml"):
        assert markup not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


# history


def test_history_keeps_sweeps_and_certificates_and_compare_judges_changes(tmp_path, capsys):
    db = tmp_path / "history.sqlite"
    plan = plan_of(tmp_path / "sweep", strategies=["ddp"], nodes=[1, 2], repetitions=3)
    spread = {0: -2.0, 1: 0.0, 2: 2.0}  # each configuration's three launches, ±2 samples/s apart

    def measure(speeds: dict[int, float]) -> None:
        write(
            plan,
            [record_for(p, v := speeds[p.nodes] + spread[p.repetition], steps=steps_around(v)) for p in plan.points],
        )

    measure({1: 100.0, 2: 150.0})
    config_json = json.dumps(plan.config.to_dict())
    assert main(["-q", "report", "--config-json", config_json, "--history", str(db)]) == 0
    assert main(["-q", "report", "--config-json", config_json, "--history", str(db)]) == 0  # not stored twice
    # the same sweep measured again: 1 node 30 % faster, launch after launch; 2 nodes 0.3 % within ±2
    measure({1: 130.0, 2: 150.5})
    assert main(["-q", "report", "--config-json", config_json, "--history", str(db)]) == 0
    runs = list_runs(db=db)
    assert [run.kind for run in runs] == ["sweep", "sweep"] and runs[0].config_hash == plan.config.config_hash()
    first = load_run(runs[0].id, db=db)
    assert {f["name"] for f in first.figures} >= {ONE, TWO, EFFICIENCY}
    one = next(f for f in first.figures if f["name"] == ONE)
    assert one["unit"] == "samples/s" and one["launches"] == [98.0, 100.0, 102.0]
    capsys.readouterr()
    assert main(["-q", "compare", str(runs[0].id), str(runs[1].id), "--db", str(db), "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)["figures"]}
    # the change is the verdict's statistic: the ratio of geometric means over launches, less 1
    assert rows[ONE]["change"] == pytest.approx(rows[ONE]["ratio"] - 1) == pytest.approx(0.3, abs=1e-3)
    assert rows[ONE]["launches"] == [3, 3]
    assert rows[ONE]["verdict"] == "better" and rows[ONE]["p"] < 0.05
    assert rows[ONE]["ratio_ci"][0] < 1.3 < rows[ONE]["ratio_ci"][1]
    assert rows[TWO]["verdict"] == "same within noise" and rows[TWO]["p"] > 0.05
    # an efficiency is a ratio of two configurations from one launch each: no run-to-run interval
    assert rows[EFFICIENCY]["verdict"] == "one launch: no run-to-run interval"
    assert main(["-q", "compare", str(runs[0].id), str(runs[1].id), "--db", str(db)]) == 0
    assert "Welch" in capsys.readouterr().out
    assert main(["-q", "history", "--db", str(db)]) == 0
    listing = capsys.readouterr().out
    assert "sweep" in listing and plan.config.config_hash()[:12] in listing
    with sqlite3.connect(db) as connection:  # what a user's own query sees
        assert connection.execute("SELECT count(*) FROM figures WHERE name = ?", (ONE,)).fetchone()[0] == 2


def test_compare_refuses_an_unknown_run(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    assert main(["-q", "compare", "1", "2", "--db", str(db)]) == 2
    assert "no run 1" in capsys.readouterr().err


def test_a_regression_against_the_last_passing_certificate_is_flagged_while_the_band_still_passes(tmp_path):
    refs = references(tmp_path, {ONE: {"value": 100.0, "lower": -0.3, "upper": 0.3, "unit": "samples/s"}})
    before = sweep_records(tmp_path, {"n1": 100.0, "n2": 100.0}, two_nodes=190.0, name="monday", repetitions=3)
    code, first = certify(tmp_path, before, refs)
    assert code == 0 and first["regressions"] == []
    after = sweep_records(tmp_path, {"n1": 85.0, "n2": 100.0}, two_nodes=190.0, name="tuesday", repetitions=3)
    code, second = certify(tmp_path, after, refs, "--spread-limit", "0.2")  # n1 and n2 15 % apart: allowed here
    assert code == 0 and second["passed"] is True  # 85 is within 100 − 30 %
    flagged = {(row["name"], row["node"]) for row in second["regressions"]}
    assert (ONE, "n1") in flagged and (ONE, "n2") not in flagged
    row = next(r for r in second["regressions"] if r["node"] == "n1")
    assert row["previous_run"] == first["history_run"] and row["change"] == pytest.approx(row["ratio"] - 1)
    assert row["p"] < 0.05 and row["ratio"] == pytest.approx(0.85, rel=1e-3)


def test_one_launch_draws_no_regression_however_narrow_its_steps(tmp_path):
    """Steps of one launch are not samples of the machine: 15 % down with tight step intervals, one launch
    each, is no regression (the old rule, disjoint step intervals, called it one)."""
    refs = references(tmp_path, {ONE: {"value": 100.0, "lower": -0.3, "upper": 0.3, "unit": "samples/s"}})
    code, first = certify(tmp_path, sweep_records(tmp_path, {"n1": 100.0}, two_nodes=190.0, name="monday"), refs)
    assert code == 0
    code, second = certify(tmp_path, sweep_records(tmp_path, {"n1": 85.0}, two_nodes=190.0, name="tuesday"), refs)
    assert code == 0 and second["compared_with"] == first["history_run"] and second["regressions"] == []


def test_the_regression_baseline_is_the_last_pass_of_the_same_suite_and_measurement_version(tmp_path):
    """Newer passing certificates of the same partition, but of another suite or another measurement
    version (every figure twice this suite's), are no baseline: with only those there is no regression
    check, and the next run is compared with this suite's own last pass."""
    refs = references(tmp_path, {ONE: {"value": 100.0, "lower": -0.3, "upper": 0.3, "unit": "samples/s"}})
    before = sweep_records(tmp_path, {"n1": 100.0, "n2": 100.0}, two_nodes=190.0, name="monday", repetitions=3)
    _, template = certify(tmp_path, before, refs, "--db", str(tmp_path / "elsewhere.sqlite"))
    doubled = [figure | {"value": figure["value"] and 2 * figure["value"]} for figure in template["figures"]]
    for changes in ({"suite": "another_suite"}, {"measurement_version": MEASUREMENT_VERSION + 1}):
        foreign = template | changes | {"date": "2999-01-01T00:00:00Z", "figures": doubled}
        store_certificate(foreign, source="elsewhere", db=tmp_path / "history.sqlite")
    code, first = certify(tmp_path, before, refs)
    assert code == 0 and first["regressions"] == [] and "compared_with" not in first
    assert any(note.startswith("no regression check:") and "suite agg " in note for note in first["notes"])
    after = sweep_records(tmp_path, {"n1": 85.0, "n2": 100.0}, two_nodes=190.0, name="tuesday", repetitions=3)
    code, second = certify(tmp_path, after, refs, "--spread-limit", "0.2")
    assert code == 0 and second["compared_with"] == first["history_run"]
    assert {row["previous_run"] for row in second["regressions"]} <= {first["history_run"]}


@pytest.mark.parametrize("suite", ["default.yaml", "gpu.yaml"])
def test_the_shipped_suites_resolve_with_their_calibration_and_the_replay(suite):
    """The shipped suites validate (their calibration too: resolve_suite checks it) and plan: per-node points on
    every node, scaling to the partition's size, each point with its replay."""
    from ddlbench.calibrate.suite import load_suite as load_calibration
    from ddlbench.certify.suite import REPO, PartitionNodes, load_suite, resolve_suite
    from ddlbench.sweep import expand_sweep

    nodes = PartitionNodes(names=("a", "b", "c"), count=3, source="local")
    config = resolve_suite(load_suite(REPO / "workflow" / "certify" / suite), system="s", partition="p", nodes=nodes)
    points = expand_sweep(config).points
    assert {point.node for point in points if point.nodes == 1} == {"a", "b", "c"}
    assert max(point.nodes for point in points) == 3 and all(point.replay_steps > 0 for point in points)
    calibration = load_calibration(REPO / config.calibrate)
    if suite == "gpu.yaml":  # NCCL's bus bandwidth needs messages of GiBs (nccl-tests #212)
        assert max(calibration.settings["message_bytes"]) >= 4 * 2**30
        assert {"all_reduce", "all_gather", "reduce_scatter"} <= set(calibration.settings["collectives"])


def test_certify_names_the_run_since_which_a_figure_changed_over_the_partitions_certificates(tmp_path, capsys):
    """Six certificates of this suite on this partition at 100 samples/s, five at 80 (stored as certify stores
    them), then a real certify at 80: the change point is the first run at 80, with its size, in the
    certificate and its printout."""
    refs = references(tmp_path, {ONE: {"value": 100.0, "lower": -0.3, "upper": 0.3, "unit": "samples/s"}})
    folder = sweep_records(tmp_path, {"n1": 80.0}, two_nodes=150.0, repetitions=3)
    _, template = certify(tmp_path, folder, refs, "--db", str(tmp_path / "elsewhere.sqlite"))
    ids = []
    for day, level in enumerate([100.0] * 6 + [80.0] * 5):
        value = level * (1 + 0.01 * ((day * 7) % 5 - 2))  # launches about 1 % apart, never twice the same
        figures = [f | {"value": value} if f["name"] == ONE else f for f in template["figures"]]
        stored = template | {"date": f"2026-10-{day + 1:02d}T00:00:00Z", "figures": figures}
        ids.append(store_certificate(stored, source="earlier", db=tmp_path / "history.sqlite")[0])
    capsys.readouterr()
    code, last = certify(tmp_path, folder, refs)
    assert code == 0  # 80 is within its band: a change point is reported, it does not fail the certificate
    changed = [row for row in last["change_points"] if row["name"] == ONE and row["node"] is None]
    assert len(changed) == 1 and changed[0]["since_run"] == ids[6], last["change_points"]
    assert changed[0]["size"] == pytest.approx(-0.2, abs=0.02) and changed[0]["p_value"] < 0.01
    assert f"change point: {ONE} since run {ids[6]}" in capsys.readouterr().out
