"""The order a sweep's points start in (ddlbench.launch.order): repetitions as blocks, each block shuffled,
so a host's drift falls on every configuration alike. Checked on the priorities, and on the real Snakemake:
left alone its scheduler fills the cores first and runs every two-rank point before any one-rank point."""

from __future__ import annotations

from datetime import datetime

from ddlbench.config import load_sweep_config
from ddlbench.launch.order import run_priorities
from ddlbench.records import read_record, record_path
from ddlbench.sweep import expand_sweep
from tests.conftest import make_point, run_snakemake


def _points(repetitions: int = 3):
    return [
        make_point(model=model, nodes=nodes, batch_size=batch, repetition=r)
        for model in ("resnet8", "vgg11")
        for nodes in (1, 2)
        for batch in (2, 4, 8)
        for r in range(repetitions)
    ]


def ordered(points, *, name: str, seed: int):
    """`points` in their run order: by run_priorities, highest first."""
    priority = run_priorities(points, name=name, seed=seed)
    return sorted(points, key=lambda p: -priority[p.point_id])


def test_every_configurations_repetition_runs_before_any_next_one_each_block_in_its_own_shuffle():
    points = _points()
    priority = run_priorities(points, name="study", seed=0)
    assert sorted(priority.values()) == list(range(1, len(points) + 1))  # a strict order
    runs = ordered(points, name="study", seed=0)
    assert [p.repetition for p in runs] == sorted(p.repetition for p in points)  # r0's block, then r1's, r2's
    blocks = [[(p.model, p.nodes, p.batch_size) for p in runs if p.repetition == r] for r in range(3)]
    assert all(sorted(block) == sorted(blocks[0]) for block in blocks)  # every configuration in every block
    assert blocks[0] != blocks[1] and blocks[1] != blocks[2]  # each block its own shuffle
    assert blocks[0] != sorted(blocks[0])  # shuffled, not in the axes' order
    # the same sweep gives the same order whatever order its points came in; another seed another one
    assert run_priorities(points[::-1], name="study", seed=0) == priority
    assert run_priorities(points, name="study", seed=1) != priority
    assert run_priorities(points, name="other", seed=0) != priority


def test_snakemake_starts_the_points_block_by_block(write_sweep, tmp_path):
    """One point at a time (`alone`), one- and two-rank points, two repetitions: every repetition-0 point
    starts before any repetition-1 point, in the order the priorities give."""
    path = write_sweep(
        name="order", models=["resnet8"], datasets=["cifar10"], strategies=["ddp"], nodes=[1, 2],
        batch_size=[4, 8], warmup_steps=1, steps=1, repetitions=2, timeout_s=120, alone=True,
    )  # fmt: skip
    config = load_sweep_config(path)
    points = expand_sweep(config).points
    records = [str(record_path(config.sweep_dir, p.point_id)) for p in points]
    result = run_snakemake(*records, "--cores", "2", "--configfile", str(path))
    assert result.returncode == 0, result.stderr[-3000:]
    started = {
        p.point_id: datetime.fromisoformat(read_record(record_path(config.sweep_dir, p.point_id)).provenance.start_time)
        for p in points
    }
    by_start = sorted(points, key=lambda p: started[p.point_id])
    assert [p.repetition for p in by_start] == [0, 0, 0, 0, 1, 1, 1, 1], [p.point_id for p in by_start]
    assert by_start == ordered(points, name=config.name, seed=config.seed)
