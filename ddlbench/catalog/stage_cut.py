"""Cutting a row of block costs into contiguous stages whose largest sum is minimal (no torch).

Pipeline and model-parallel strategies cut their model with it at run time
(ddlbench.train.strategies.balance) and the analytical model cuts the same way when it predicts them.
"""

from __future__ import annotations

from collections.abc import Sequence


def partition(costs: Sequence[float], parts: int) -> tuple[tuple[int, int], ...]:
    """Cut `costs` into `parts` non-empty contiguous ranges [lo, hi) whose largest sum is minimal.

    The bottleneck comes from the exact dynamic programme over prefixes (O(parts·n²), n is a few
    dozen blocks at most). Among the cuts reaching it, the one where each stage, front to back,
    takes as many blocks as the bottleneck allows is returned, so equal inputs give equal cuts.
    """
    n = len(costs)
    if parts < 1:
        raise ValueError(f"cannot cut into {parts} stages; need at least 1")
    if parts > n:
        raise ValueError(f"cannot cut {n} blocks into {parts} stages: every stage needs at least one block")
    if any(c < 0 for c in costs):
        raise ValueError(f"block costs must not be negative: {list(costs)}")
    prefix = [0.0] * (n + 1)
    for i, c in enumerate(costs):
        prefix[i + 1] = prefix[i] + c

    # Range sums are always prefix differences, in the programme and in the reconstruction alike:
    # float rounding is monotone, so both see the same order and the reconstruction stays feasible.
    def span(lo: int, hi: int) -> float:
        return prefix[hi] - prefix[lo]

    inf = float("inf")
    # best[j][i]: the smallest bottleneck of the first i blocks in j stages
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for j in range(1, parts + 1):
        for i in range(j, n - (parts - j) + 1):
            best[j][i] = min(max(best[j - 1][c], span(c, i)) for c in range(j - 1, i))
    bottleneck = best[parts][n]

    # Greedy front-filling under the optimal bottleneck: a stage that ends as late as it can leaves
    # the shortest suffix, which the remaining stages can always cover (each block alone fits).
    bounds: list[tuple[int, int]] = []
    lo = 0
    for stage in range(parts):
        left = parts - stage - 1  # stages still to come, one block each at least
        hi = lo + 1
        while hi < n - left and span(lo, hi + 1) <= bottleneck:
            hi += 1
        if stage == parts - 1:
            hi = n
        bounds.append((lo, hi))
        lo = hi
    return tuple(bounds)
