"""The silent-data-corruption check of a certification: every rank's replay (ddlbench.train.replay) compared
bit for bit with every other replay of the same computation on the same kind of device, across the points
and nodes of the run.

Replays are one computation when they share the model (and its options), dataset, per-rank batch, seed,
learning rate, precision, layout and replay steps, and ran on the same kind of device (the GPU's name, or
the CPU's model on the CPU), with the same intra-op threads and the same torch: a CPU's reductions change
with its thread count, and another build may pick other kernels. Within such a group the replays should hold
one digest. The digest most of them hold (a strict majority) is the group's; a replay is odd when

- its digest differs from the majority's (the finding says where it first differs: a step's loss, a step's
  gradients, or only the final weights), or
- its own passes disagreed (`repeatable` false) and it ran no operation that torch says is nondeterministic:
  a device that gives different answers to the same question.

Figures, one per group and node, family `replay`: `replay/<model>-<dataset>-b<batch>-<precision>-rp<steps>`
(with `-t<threads>` on the CPU), unit `replays`, value = the node's odd replays, n = the node's replays.
Their verdict needs no reference (`Figure.check`): `pass` when the node has none odd, `failed` when it has,
naming each (point, rank, GPU UUID or index) and what differs. Where no strict majority exists (two replays
that differ, or three that all do), every node of the group is `failed` with value None: the replays disagree
and nothing says which is wrong. A group of one replay has nothing to compare with: `check` is empty and the
figure is listed as `no reference`, with its repeatability in its basis.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ddlbench.history.figures import Figure
from ddlbench.records import PointRecord


@dataclass(frozen=True, kw_only=True)
class Replay:
    """One rank's replay, with where it ran."""

    name: str  # the figure name of its computation
    group: tuple[Any, ...]  # the computation and the kind of device: replays to compare
    point_id: str
    rank: int
    node: str
    device: str  # "GPU <uuid>" / "cuda:<index>" / "cpu"
    result: dict[str, Any]

    @property
    def where(self) -> str:
        return f"rank {self.rank} of {self.point_id} on {self.node} ({self.device})"

    @property
    def flaky(self) -> bool:
        return flaky(self.result)


def flaky(result: dict[str, Any]) -> bool:
    """A replay whose own passes disagreed, with no operation it ran (nondeterministic in torch's words) to
    excuse that."""
    return not result.get("repeatable", True) and not result.get("nondeterministic_ops")


def majority(results: Iterable[dict[str, Any]]) -> tuple[str, int, bool]:
    """The most common digest of some replays, how many hold it, and whether they are a strict majority."""
    digests = [result["digest"] for result in results]
    digest, held = Counter(digests).most_common(1)[0]
    return digest, held, held * 2 > len(digests)


def is_odd(result: dict[str, Any], digest: str) -> bool:
    """A replay the check names: its digest differs from the majority's, or it is flaky."""
    return result["digest"] != digest or flaky(result)


def collect_replays(records: Iterable[PointRecord]) -> list[Replay]:
    """Every rank's replay in `records` (ranks of failed points that finished theirs included)."""
    replays = []
    for record in records:
        point = record.point
        for rank in record.ranks:
            if not rank.replay:
                continue
            kind = rank.device_name or record.provenance.cpu_model
            name = f"replay/{point.model}-{point.dataset}-b{point.batch_size}-{point.precision}-rp{point.replay_steps}"
            if rank.device != "cuda":
                name += f"-t{rank.threads}"
            group = (
                name, point.model_options, point.seed, point.learning_rate, point.channels_last,
                rank.device, kind, rank.threads, rank.torch_version,
            )  # fmt: skip
            gpu = rank.gpu or {}
            device = f"GPU {gpu['uuid']}" if gpu.get("uuid") else (f"cuda:{gpu['index']}" if "index" in gpu else "cpu")
            node = rank.slurm_node or rank.hostname
            where = dict(point_id=point.point_id, rank=rank.rank, node=node, device=device)
            replays.append(Replay(name=name, group=group, result=rank.replay, **where))
    return replays


def replay_figures(records: Iterable[PointRecord]) -> list[Figure]:
    """The check's figures (see the module docstring), per group and node, in name and node order."""
    groups: dict[tuple[Any, ...], list[Replay]] = defaultdict(list)
    for replay in collect_replays(records):
        groups[replay.group].append(replay)
    figures = []
    for members in groups.values():
        figures.extend(_group_figures(members))
    return sorted(figures, key=lambda figure: (figure.name, figure.node or ""))


def _group_figures(members: list[Replay]) -> list[Figure]:
    common, held, decided = majority(replay.result for replay in members)
    nodes: dict[str, list[Replay]] = defaultdict(list)
    for replay in members:
        nodes[replay.node].append(replay)
    name, total = members[0].name, len(members)
    figures = []
    for node, here in sorted(nodes.items()):
        if total == 1:
            repeatable = "repeatable" if not here[0].flaky else "NOT repeatable"
            basis = f"one replay: nothing to compare it with ({repeatable} across its own passes)"
            figures.append(_figure(name, node, value=0, n=1, basis=basis, check="", finding=""))
            continue
        basis = (
            f"{total} replays of one computation compared bit for bit (losses, gradient and weight checksums); "
            f"{held} hold the most common digest"
        )
        if not decided:
            finding = f"the {total} replays disagree and no majority says which is right: " + "; ".join(
                f"{replay.where}: digest {replay.result['digest'][:12]}" for replay in members
            )
            figures.append(_figure(name, node, value=None, n=len(here), basis=basis, check="failed", finding=finding))
            continue
        reference = next(replay for replay in members if replay.result["digest"] == common)
        odd = [replay for replay in here if is_odd(replay.result, common)]
        finding = "; ".join(f"{replay.where}: {_difference(replay, reference, held)}" for replay in odd)
        check = "failed" if odd else "pass"
        figures.append(_figure(name, node, value=len(odd), n=len(here), basis=basis, check=check, finding=finding))
    return figures


def _difference(replay: Replay, reference: Replay, held: int) -> str:
    """Where an odd replay first departs from the majority's, in words."""
    mine, theirs = replay.result, reference.result
    if mine["digest"] == theirs["digest"]:
        return "its own passes disagree (the device gives different answers to the same computation)"
    where = "only the final weights differ"
    for step, (a, b) in enumerate(zip(mine["losses_hex"], theirs["losses_hex"], strict=False)):
        if a != b:
            where = f"step {step}'s loss differs ({float.fromhex(a):.9g} vs {float.fromhex(b):.9g})"
            break
        if mine["grad_sha256"][step] != theirs["grad_sha256"][step]:
            where = f"step {step}'s gradients differ (its loss agrees)"
            break
    repeatable = "every time (repeatable)" if mine.get("repeatable") else "and its own passes disagree"
    excuse = mine.get("nondeterministic_ops") or []
    note = f"; it ran operations torch calls nondeterministic: {', '.join(excuse)}" if excuse else ""
    injected = f" (its record says a fault was injected there: {mine['corrupted']})" if mine.get("corrupted") else ""
    return f"checksums differ from the {held} that agree: {where}, {repeatable}{note}{injected}"


def _figure(name: str, node: str, *, value: int | None, n: int, basis: str, check: str, finding: str) -> Figure:
    return Figure(
        name=name, unit="replays", kind="replay", value=value, ci_low=None, ci_high=None, n=n, basis=basis,
        node=node, why_missing=finding if value is None else "", check=check, finding=finding,
    )  # fmt: skip
