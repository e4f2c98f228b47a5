"""How often the report's verdicts are wrong, and how often they find a real difference: the real code
(ddlbench.analysis.verdicts.judge_cell, what the report judges each cell with) driven by simulated launches.

Each draw is one cell: k strategies × n launches, each launch's throughput lognormal around its strategy's
true value with a coefficient of variation CV (5 % by default: a busy cluster's run-to-run variation).

- false alarms (A/A): every strategy equal; the share of draws where the cell says anything is faster: the
  "fastest" claim, or any "faster" beside a runner-up or a further strategy. It must stay ≤ α = 0.05 at every
  size. Beside it, the old procedure (the winner, chosen by the data, against each other strategy, Holm over
  those k − 1 comparisons as if the winner had been named beforehand), which the selection makes too eager;
- power: one strategy faster by 10 % or 30 %, the others equal; the share of draws where that strategy is
  declared fastest.

Each rate is over DRAWS draws, with its 95 % Wilson interval. Run:
    python benchmarks/verdict_errors.py [--draws 2000] [--cv 0.05] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import random
import time

from ddlbench.analysis.verdicts import ALPHA, contrast, judge, judge_cell

STRATEGIES = (2, 3, 5, 10)
LAUNCHES = (3, 6, 10)
EFFECTS = (0.10, 0.30)


def draw(rng: random.Random, k: int, n: int, cv: float, faster: float = 0.0) -> list[list[float]]:
    """k strategies × n launches; strategy 0 is `faster` (a fraction) faster than the others."""
    sigma = math.log1p(cv)
    return [[math.exp(rng.gauss(math.log(100.0 * (1 + (faster if i == 0 else 0))), sigma)) for _ in range(n)]
            for i in range(k)]  # fmt: skip


def wilson(hits: int, draws: int) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion."""
    z, p = 1.959964, hits / draws
    centre = (p + z * z / (2 * draws)) / (1 + z * z / draws)
    half = z * math.sqrt(p * (1 - p) / draws + z * z / (4 * draws * draws)) / (1 + z * z / draws)
    return max(0.0, centre - half), min(1.0, centre + half)


def old_procedure(launches: list[list[float]]) -> bool:
    """The report's former verdict on one cell: the winner, chosen by the data, against each other strategy as
    if named beforehand (Holm over those k − 1 comparisons), any 'faster' an alarm."""
    means = [math.fsum(math.log(v) for v in values) / len(values) for values in launches]
    winner = max(range(len(launches)), key=lambda i: means[i])
    tests = [contrast(launches[other], launches[winner]) for other in range(len(launches)) if other != winner]
    return any(verdict.direction for verdict in judge(tests))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--cv", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    began = time.perf_counter()
    print(f"verdict errors: {args.draws} draws per size, launches lognormal with CV {args.cv:g}, alpha {ALPHA:g}")
    print(f"{'k':>3} {'n':>3}  {'false alarm (any faster)':>30}  {'old: winner vs the others':>30}  "
          f"{'power at +10 %':>24}  {'power at +30 %':>24}")  # fmt: skip
    worst = 0.0
    for k in STRATEGIES:
        for n in LAUNCHES:
            groups = [str(i) for i in range(k)]
            alarms = old = 0
            for _ in range(args.draws):
                launches = draw(rng, k, n, args.cv)
                cell = judge_cell(launches, groups)
                alarms += any(verdict.direction for verdict in cell.against.values())
                old += old_procedure(launches)
            power = []
            for effect in EFFECTS:
                found = 0
                for _ in range(args.draws):
                    cell = judge_cell(draw(rng, k, n, args.cv, effect), groups)
                    found += cell.fastest and cell.winner == 0
                power.append(found)
            worst = max(worst, alarms / args.draws)
            cells = [_rate(alarms, args.draws), _rate(old, args.draws), *(_rate(f, args.draws) for f in power)]
            print(f"{k:>3} {n:>3}  {cells[0]:>30}  {cells[1]:>30}  {cells[2]:>24}  {cells[3]:>24}")
    print(f"largest false-alarm rate: {100 * worst:.2f} % (alpha {100 * ALPHA:g} %): "
          f"{'within' if worst <= ALPHA else 'ABOVE'} alpha; {time.perf_counter() - began:.0f} s")  # fmt: skip


def _rate(hits: int, draws: int) -> str:
    low, high = wilson(hits, draws)
    return f"{100 * hits / draws:.2f} % [{100 * low:.2f}, {100 * high:.2f}]"


if __name__ == "__main__":
    main()
