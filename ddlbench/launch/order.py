"""The order a sweep's points run in: repetitions as blocks, configurations shuffled within each block.

A machine's speed drifts over minutes (a shared host's neighbours, its clock, its caches): on the 2-core
development host the probe's convolution read 3.5-4.5 ms in one quarter of an hour and 4.7-7.2 ms in the
next (scoring set 13, 2026-12-03). A sweep that runs all of one kind of configuration before another (as
Snakemake's scheduler does left alone: it fills the cores first, so every two-rank point of set 13 ran in
its first 15 minutes and every one-rank point in its last 6) gives each kind its own stretch of the drift,
and a comparison between them measures the clock as much as the strategies.

So the points run as a randomised complete block design (Box, Hunter and Hunter, *Statistics for
Experimenters*, ch. 4): every configuration's repetition 0 before any repetition 1, and so on, each block
in its own shuffled order. Drift then falls on every configuration alike, within a block, and across
blocks it becomes the launch-to-launch spread the verdicts already account for (ddlbench.analysis.verdicts
rests on launches). The shuffle is seeded by the sweep's name and seed, so a sweep run again, or rerun for
its missing points, keeps its order.

`run_priorities` gives each point a priority, higher first: Snakemake starts the ready jobs of higher
priority first (workflow/rules/points.smk). `ddlbench submit` and `--pack` keep their own order (one array
per allocation shape; the widest points packed first).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from ddlbench.point import Point


def run_priorities(points: Sequence[Point], *, name: str, seed: int = 0) -> dict[str, int]:
    """Point id → priority (a positive int, higher runs first): blocks by repetition, r0's block first,
    the configurations of each block in a shuffle seeded by (name, seed, repetition)."""
    blocks: dict[int, list[Point]] = {}
    for point in points:
        blocks.setdefault(point.repetition, []).append(point)
    order: list[Point] = []
    for repetition in sorted(blocks):
        block = sorted(blocks[repetition], key=lambda p: p.point_id)  # independent of the points' given order
        digest = hashlib.sha256(f"{name}\0{seed}\0{repetition}".encode()).digest()
        random.Random(int.from_bytes(digest[:8], "big")).shuffle(block)
        order.extend(block)
    return {point.point_id: len(order) - index for index, point in enumerate(order)}
