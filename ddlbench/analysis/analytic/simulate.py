"""A step as a small discrete-event simulation: ranks with a compute lane and a communication lane.

A strategy's model writes what each rank does in one step as ops, in the order the rank issues them:
compute (forward, backward, loss, update of some blocks) on the rank's compute lane, collectives and
transfers on its communication lane, with dependencies (a backward needs the gradient a later stage
sent; a bucket's all-reduce needs the backward that produced its gradients; the update needs every
reduction). Each lane runs its ops one at a time in issue order, each as soon as its lane is free and
its dependencies have ended (list scheduling). That is how a real step runs: a CUDA stream or a
process's Python thread executes in order, and gloo or NCCL runs a process group's collectives in the
order they were issued.

Ranks that share a host's cores and memory slow each other only while they compute at the same time. A
compute op may carry two prices: `duration_s`, timed with every rank of its host computing at once (the
calibration's operators at that many ranks a node), and `alone_s`, timed with its rank alone. Where a program
gives the ranks' hosts and some op both prices, the step runs as a fluid simulation: between two events each
running compute op advances at 1 / price, its price interpolated linearly from `alone_s` (its rank the only
one of its host computing) to `duration_s` (all of them), so a pipeline stage that updates while the other
stage waits for its gradients runs at the price of one rank alone. Communication keeps its one price. Without
hosts or second prices, it is the list scheduling above, op for op.

A CPU rank's communication runs on the rank's own cores (gloo's threads beside its compute, the rank pinned to
its threads' cores). Where the machine measured how much of them a collective in flight takes (`comm_share`,
the calibration's beside figure), communication keeps its own lane and the rank's compute advances at
(1 − comm_share) × its rate while the rank's communication lane is busy: 0 hides it for free, 1 stops the
compute until it is done. The cores go both ways: where the machine measured how much longer a collective runs
beside compute than alone (`comm_stretch`), a collective advances at 1 / comm_stretch of its rate while its
rank computes. Without those figures, `overlap` False puts communication on the compute lane.

What it gives, per rank (seconds, summing exactly to the step):
- compute_s: busy time of the compute lane;
- exposed_comm_s: the part of the compute lane's idle time during which the rank's own communication
  lane was busy (it waited on a collective or a transfer: what the recorder measures as exposed);
- bubble_s: the rest of its idle time, both lanes idle: waiting on other ranks (pipeline fill and
  drain, imbalance).
comm_s is the busy time of the communication lane, hidden_comm_s = comm_s − exposed_comm_s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Lane = Literal["compute", "comm"]


@dataclass(kw_only=True)
class Op:
    index: int
    rank: int
    lane: Lane  # the queue it executes in
    kind: str  # compute | comm | step (a step's zero-length start)
    duration_s: float
    deps: tuple[int, ...]
    label: str  # what it is, e.g. "F3 s1", "all_reduce bucket 0"
    step: int = 0
    start_s: float = 0.0
    end_s: float = 0.0
    alone_s: float | None = None  # a compute op's price with no other rank of its host computing
    collective: str | None = None  # a communication op's collective (all_reduce, ...), where its figures differ


@dataclass(frozen=True, kw_only=True)
class RankTime:
    """One rank's step, split so that compute + exposed comm + bubble = step (seconds)."""

    rank: int
    compute_s: float
    comm_s: float
    exposed_comm_s: float
    bubble_s: float

    @property
    def hidden_comm_s(self) -> float:
        return max(0.0, self.comm_s - self.exposed_comm_s)


@dataclass(frozen=True, kw_only=True)
class Timeline:
    step_s: float
    ranks: tuple[RankTime, ...]
    ops: tuple[Op, ...]

    def mean(self, attribute: str) -> float:
        """Mean over ranks of one RankTime figure (the measured phases are means over ranks too)."""
        return sum(getattr(rank, attribute) for rank in self.ranks) / len(self.ranks)


@dataclass
class Program:
    """The ops of one step, added in each rank's issue order."""

    ops: list[Op] = field(default_factory=list)
    # rank → the host it shares with others (ranks alone on theirs may be left out); empty: no contention
    hosts: dict[int, int] = field(default_factory=dict)

    def add(
        self,
        rank: int,
        lane: Lane,
        duration_s: float,
        *,
        deps: tuple[int, ...] | list[int] = (),
        label: str = "",
        alone_s: float | None = None,
        collective: str | None = None,
    ) -> int:
        if duration_s < 0 or (alone_s is not None and alone_s < 0):
            raise ValueError(f"op {label!r} has a negative duration {duration_s} (alone {alone_s})")
        op = Op(
            index=len(self.ops),
            rank=rank,
            lane=lane,
            kind=lane,
            duration_s=duration_s,
            deps=tuple(d for d in deps if d is not None),
            label=label,
            alone_s=alone_s,
            collective=collective,
        )
        self.ops.append(op)
        return op.index

    def compute(self, rank: int, duration_s: float, *, deps=(), label: str = "", alone_s: float | None = None) -> int:
        """A compute op; `alone_s`, where given, its price while no other rank of its host computes."""
        return self.add(rank, "compute", duration_s, deps=deps, label=label, alone_s=alone_s)

    def comm(self, rank: int, duration_s: float, *, deps=(), label: str = "", collective: str | None = None) -> int:
        """A communication op; `collective`, where given, names it for its own beside figures (simulate)."""
        return self.add(rank, "comm", duration_s, deps=deps, label=label, collective=collective)


def simulate(
    program: Program,
    *,
    steps: int = 3,
    overlap: bool = True,
    comm_share: float | None = None,
    comm_stretch: float | None = None,
    comm_beside: Mapping[str, tuple[float, float | None]] | None = None,
) -> Timeline:
    """Runs `steps` copies of the program back to back and describes the middle one.

    A rank starts its next step as soon as it has finished its own previous one (its step() returned:
    its update done and its collectives waited for), with no barrier, so a pipeline's later stage may
    start its step while the first stage still finishes the last one. The step's time is what ddlbench
    measures: the latest end minus the earliest start over ranks. With `overlap` False a rank's
    communication runs on its compute lane, in issue order: a CPU whose cores are all busy computing has
    none left for the communication thread to progress on its own. With `comm_share` (0 to 1) communication
    keeps its lane whatever `overlap` says and slows the rank's compute while it runs (the module's doc); with
    `comm_stretch` (at least 1) too, a collective runs that many times longer while its rank computes.
    `comm_beside` gives a collective named on its op its own (share, stretch or None) in place of those two.
    """
    if comm_share is not None and not 0.0 <= comm_share <= 1.0:
        raise ValueError(f"comm_share is a share of the rank's cores, from 0 to 1, not {comm_share}")
    if comm_stretch is not None and (comm_share is None or comm_stretch < 1.0):
        raise ValueError(f"comm_stretch is at least 1, and only beside a comm_share, not {comm_stretch}")
    for name, (share, stretch) in (comm_beside or {}).items():
        if comm_share is None or not 0.0 <= share <= 1.0 or (stretch is not None and stretch < 1.0):
            raise ValueError(
                f"comm_beside[{name!r}] is a share from 0 to 1 and a stretch of at least 1, beside a comm_share, "
                f"not ({share}, {stretch})"
            )
    base_ops = program.ops
    ranks = sorted({op.rank for op in base_ops})
    ops: list[Op] = []
    previous: dict[int, list[int]] = {rank: [] for rank in ranks}
    starts: list[dict[int, int]] = []
    for step in range(max(1, steps)):
        boundary = {}
        for rank in ranks:  # the rank's step begins once its previous step's ops have all ended
            boundary[rank] = len(ops)
            ops.append(
                Op(
                    index=len(ops),
                    rank=rank,
                    lane="compute",
                    kind="step",
                    duration_s=0.0,
                    deps=tuple(previous[rank]),
                    label=f"step {step}",
                )
            )
        offset = len(ops)
        mine: dict[int, list[int]] = {rank: [] for rank in ranks}
        for op in base_ops:
            index = len(ops)
            ops.append(
                Op(
                    index=index,
                    rank=op.rank,
                    lane=op.lane if overlap or comm_share is not None else "compute",
                    kind=op.kind,
                    duration_s=op.duration_s,
                    deps=(*(d + offset for d in op.deps), boundary[op.rank]),
                    label=op.label,
                    step=step,
                    alone_s=op.alone_s,
                    collective=op.collective,
                )
            )
            mine[op.rank].append(index)
        previous = mine
        starts.append(boundary)
    contended = program.hosts and any(op.alone_s is not None and op.alone_s != op.duration_s for op in ops)
    if contended or comm_share is not None:
        _run_shared(ops, program.hosts, comm_share=comm_share, comm_stretch=comm_stretch, comm_beside=comm_beside)
    else:
        _run(ops)
    middle = min(1, len(starts) - 1)
    start = {rank: ops[starts[middle][rank]].end_s for rank in ranks}
    step_ops = [op for op in ops if op.step == middle and op.kind != "step"]
    end = {rank: max((op.end_s for op in step_ops if op.rank == rank), default=start[rank]) for rank in ranks}
    window = (min(start.values()), max(end.values()))
    step_s = window[1] - window[0]
    return Timeline(
        step_s=step_s,
        ranks=tuple(
            _rank_time([op for op in step_ops if op.rank == rank], rank, start[rank], step_s) for rank in ranks
        ),
        ops=tuple(step_ops),
    )


def _lanes(ops: list[Op]) -> dict[tuple[int, Lane], list[Op]]:
    """Each rank's lanes, their ops in issue order."""
    lanes: dict[tuple[int, Lane], list[Op]] = {}
    for op in ops:
        lanes.setdefault((op.rank, op.lane), []).append(op)
    return lanes


def _stuck(lanes: dict[tuple[int, Lane], list[Op]], position: dict[tuple[int, Lane], int]) -> ValueError:
    stuck = [queue[position[key]].label for key, queue in lanes.items() if position[key] < len(queue)]
    return ValueError(f"the step's ops wait on each other: {', '.join(stuck[:6])}")


def _run(ops: list[Op]) -> None:
    """List scheduling: each lane in issue order, each op once its lane is free and its deps have ended."""
    lanes = _lanes(ops)
    position = dict.fromkeys(lanes, 0)
    free = dict.fromkeys(lanes, 0.0)
    done = [False] * len(ops)
    remaining = len(ops)
    while remaining:
        progressed = False
        for key, queue in lanes.items():
            while position[key] < len(queue):
                op = queue[position[key]]
                if not all(done[d] for d in op.deps):
                    break
                op.start_s = max([free[key], *(ops[d].end_s for d in op.deps)])
                op.end_s = op.start_s + op.duration_s
                free[key] = op.end_s
                done[op.index] = True
                position[key] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise _stuck(lanes, position)


def _run_shared(
    ops: list[Op],
    hosts: dict[int, int],
    comm_share: float | None = None,
    comm_stretch: float | None = None,
    comm_beside: Mapping[str, tuple[float, float | None]] | None = None,
) -> None:
    """Each lane in issue order, each op once its lane is free and its deps have ended, as _run; between
    events a compute op advances at 1 / its price at the number of its host's ranks computing then, times
    (1 − comm_share) while its rank's communication lane is busy (where comm_share is given), and a
    communication op at 1 / (its price × comm_stretch) while its rank computes (where comm_stretch is given); a
    collective named in comm_beside with its own share and stretch."""

    def figures(op: Op) -> tuple[float, float]:
        share, stretch = (comm_beside or {}).get(op.collective or "", (comm_share, comm_stretch))
        return share or 0.0, stretch or 1.0

    lanes = _lanes(ops)
    size: dict[int, int] = {}
    for rank in {op.rank for op in ops}:
        if rank in hosts:
            size[hosts[rank]] = size.get(hosts[rank], 0) + 1
    position = dict.fromkeys(lanes, 0)
    running: dict[tuple[int, Lane], list] = {}  # lane → [op, fraction of its work left]
    done = [False] * len(ops)
    remaining, now = len(ops), 0.0

    def price(op: Op, busy: int) -> float:
        host = hosts.get(op.rank)
        if op.kind != "compute" or op.alone_s is None or host is None:
            return op.duration_s
        if size[host] < 2:  # alone on its host
            return op.alone_s
        share = (busy - 1) / (size[host] - 1)
        return op.alone_s + (op.duration_s - op.alone_s) * share

    while remaining:
        started = True
        while started:  # start what can start now; ops of no length end where they start
            started = False
            for key, queue in lanes.items():
                while key not in running and position[key] < len(queue):
                    op = queue[position[key]]
                    if not all(done[d] for d in op.deps):
                        break
                    op.start_s = now
                    position[key] += 1
                    if op.duration_s > 0 or (op.alone_s or 0.0) > 0:
                        running[key] = [op, 1.0]
                    else:
                        op.end_s, done[op.index] = now, True
                        remaining -= 1
                    started = True
        if not running:
            if remaining:
                raise _stuck(lanes, position)
            break
        busy: dict[int, int] = {}
        for op, _ in running.values():
            if op.kind == "compute" and op.rank in hosts:
                busy[hosts[op.rank]] = busy.get(hosts[op.rank], 0) + 1
        # a rank's one communication lane: at most one collective of its in flight
        talking = {op.rank: op for op, _ in running.values() if op.kind == "comm"} if comm_share is not None else {}
        computing = {op.rank for op, _ in running.values() if op.kind == "compute"}

        rates = {
            key: _slowed(op, talking, computing, figures, comm_share is not None)
            / max(price(op, busy.get(hosts.get(op.rank, -1), 1)), 1e-300)
            for key, (op, _) in running.items()
        }
        step = min(left / rates[key] for key, (_, left) in running.items() if rates[key] > 0)
        now += step
        for key in list(running):
            op, left = running[key]
            left -= rates[key] * step
            if left <= 1e-12:
                op.end_s, done[op.index] = now, True
                remaining -= 1
                del running[key]
            else:
                running[key][1] = left


def _slowed(op: Op, talking: dict[int, Op], computing: set[int], figures, shared: bool) -> float:
    """The share of its own rate a running op advances at: a computation at 1 − the share of the collective its
    rank has in flight, a collective at 1 / its stretch while its rank computes (only with a share: `shared`)."""
    if op.kind == "compute" and op.rank in talking:
        return 1.0 - figures(talking[op.rank])[0]
    if shared and op.kind == "comm" and op.rank in computing:
        return 1.0 / figures(op)[1]
    return 1.0


def _rank_time(ops: list[Op], rank: int, start: float, step: float) -> RankTime:
    compute = sorted((op for op in ops if op.kind == "compute"), key=lambda op: op.start_s)
    comm = [op for op in ops if op.kind == "comm" and op.duration_s > 0]
    busy = _union([(op.start_s, op.end_s) for op in comm])
    # the rank's idle spans within its own step: before its first computation, between computations,
    # after the last until its step ends; time outside its own step counts as bubble
    end = max((op.end_s for op in ops), default=start)
    idle, previous_end = [], start
    for op in compute:
        if op.start_s > previous_end:
            idle.append((previous_end, op.start_s))
        previous_end = max(previous_end, op.end_s)
    if end > previous_end:
        idle.append((previous_end, end))
    exposed = sum(_overlap(span, busy) for span in idle)
    compute_s = sum(op.end_s - op.start_s for op in compute)  # the price paid: contention may have changed it
    comm_s = sum(op.end_s - op.start_s for op in comm)  # the time it ran: beside compute it may stretch
    exposed = min(exposed, max(0.0, step - compute_s))
    return RankTime(
        rank=rank,
        compute_s=compute_s,
        comm_s=comm_s,
        exposed_comm_s=exposed,
        bubble_s=max(0.0, step - compute_s - exposed),
    )


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(span: tuple[float, float], busy: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(span[1], end) - max(span[0], start)) for start, end in busy)
