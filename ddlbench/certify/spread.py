"""The spread of one figure across the GPUs of a node or the nodes of a partition, judged against a limit.

Devices of one type differ: PRISM (arXiv 2510.15596) measured GPUs of one model up to 14 % apart on GEMM.
Each device or node may pass its band and the partition still be uneven enough to slow every synchronous job
to its slowest member, so an administrator also judges the spread. For every figure measured on two or more
GPUs of a node (names ending in `/cuda:<i>`, the node levels) or on two or more nodes (per-node figures of the
suite, `each_node`), a check figure:

- `spread/<figure name without its device>` (unit 1): (max − min) ÷ max over the members' values (each a
  median, or a node level's worst percentile, as its figure is), 0 when they are equal; no interval (a range of
  point estimates); n = the members;
- `pass` when it is at most the limit (`--spread-limit`, DEFAULT_LIMIT), else `failed`, the finding naming the
  slowest and the fastest member with their values.

Checks (replay, health) and figures without a value take no part.
"""

from __future__ import annotations

import re
from collections import defaultdict

from ddlbench.history.figures import CHECK_KINDS, Figure

DEFAULT_LIMIT = 0.10
_DEVICE = re.compile(r"/cuda:\d+$")


def spread_figures(figures: list[Figure], limit: float = DEFAULT_LIMIT) -> list[Figure]:
    """The spread checks of `figures` (module docstring), in name order."""
    groups: dict[str, list[tuple[str, Figure]]] = defaultdict(list)
    for figure in figures:
        if figure.kind in CHECK_KINDS or figure.value is None:
            continue
        if figure.node:  # a node's figure: its members are the nodes
            groups[figure.name].append((figure.node, figure))
        elif device := _DEVICE.search(figure.name):  # a GPU's figure: its members are the node's GPUs
            groups[figure.name[: device.start()]].append((device.group().lstrip("/"), figure))
    return [_spread(name, members, limit) for name, members in sorted(groups.items()) if len(members) > 1]


def _spread(name: str, members: list[tuple[str, Figure]], limit: float) -> Figure:
    low_member, low = min(members, key=lambda member: member[1].value)
    high_member, high = max(members, key=lambda member: member[1].value)
    value = 0.0 if high.value == 0 else (high.value - low.value) / high.value
    passed = value <= limit
    finding = "" if passed else (
        f"{low_member} {low.value:.4g} vs {high_member} {high.value:.4g} {high.unit}: {100 * value:.1f} % apart, "
        f"above the limit of {100 * limit:g} %"
    )  # fmt: skip
    what = "nodes" if low.node else "GPUs of the node"
    return Figure(
        name=f"spread/{name}", unit="1", kind="spread", value=value, ci_low=None, ci_high=None, n=len(members),
        basis=f"(max − min) ÷ max over {len(members)} {what}' values (no interval); limit {100 * limit:g} %",
        check="pass" if passed else "failed", finding=finding,
    )  # fmt: skip
