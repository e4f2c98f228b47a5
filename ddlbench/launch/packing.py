"""Packing a sweep's points into allocations: which allocation runs each point, when, on which nodes.

A packed sweep asks SLURM for a few allocations of N nodes instead of one job per point; inside each,
every point is an `srun` step on nodes of its own (ddlbench.launch.allocation). The plan here is the
one the allocation's dispatcher carries out, by the same rule, so what `ddlbench plan --pack` prints is
what runs when points take their expected time:

- **Order**: points by nodes, most first, then by duration, longest first (then by id). Wide points
  first is what keeps a narrow tail from idling a wide allocation; longest first within a width is
  Graham's LPT rule for the tail (Graham 1969: within 4/3 of the optimum on identical machines).
- **Greedy list scheduling with backfill of the present**: whenever nodes free up, the first points
  in that order that fit the free nodes start, a narrower later point before a wider earlier one
  that does not fit yet. A point pinned to a node (`each_node`) waits for that node.
- **Allocations end at a time limit** (`max_time_s`, the partition's MaxTime): a point starts in an
  allocation only if its limit still fits before the allocation's end; the points that do not go to
  the next allocation, planned the same way.
- **An allocation already held** (salloc, sbatch: `pack_into`): every point in it by the same rule,
  pinned and free points on the same nodes, up to the time left of it; the points that do not fit that
  time come last, and start only where the points before them ended early enough.

Two durations per point: its *limit* (its timeout: the most it may run) sets each allocation's time
limit, so an allocation whose points all run to their limits still finishes them (the dispatcher
follows the same rule; a schedule of shorter points can in principle come out longer, Graham's
anomaly, and then the points left unrun keep no record and a rerun picks them up). Its *expected*
time (predicted from a machine file, else its limit) gives the predicted makespan and idle share.

Every figure is in seconds or node-seconds of the plan; the lower bound of an allocation's makespan
is max(longest point, Σ nodes × duration ÷ N), so makespan ÷ bound says how far from optimal the
packing can be at most. Torch-free and pure: the login node plans 10,000 points in well under a second.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ddlbench.errors import DdlbenchError


@dataclass(frozen=True, kw_only=True)
class Task:
    """What the packing needs of a point."""

    key: str  # the point id
    nodes: int
    limit_s: float  # the most it may run: its timeout
    expected_s: float  # what it is expected to take (predicted, else its limit)
    node: str = ""  # the node it must run on ("" any)

    def duration(self, which: str) -> float:
        return self.limit_s if which == "limit" else self.expected_s


@dataclass(frozen=True, kw_only=True)
class Placement:
    key: str
    start_s: float
    end_s: float
    slots: tuple[str, ...]  # node slots of the allocation: a pinned node's name, or "#i" for any node


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """One allocation's points as they run when each takes its `which` duration."""

    which: str  # "limit" or "expected"
    placements: tuple[Placement, ...]  # in start order

    @property
    def makespan_s(self) -> float:
        return max((p.end_s for p in self.placements), default=0.0)


@dataclass(frozen=True, kw_only=True)
class Allocation:
    """One SLURM job of `nodes` nodes, running `order`'s points by the packing's rule."""

    index: int
    nodes: int
    named: tuple[str, ...]  # nodes the allocation must include (pinned points'); the rest: any
    order: tuple[Task, ...]  # the dispatcher's order
    serial: bool  # one point at a time (pinned points where the nodes share hardware: slurm.pinned_one_at_a_time)
    worst: Schedule  # every point at its limit: sets the time limit
    expected: Schedule  # every point at its expected time: the predicted makespan

    @property
    def busy_node_s(self) -> float:
        return sum(task.nodes * task.expected_s for task in self.order)

    @property
    def allocated_node_s(self) -> float:
        return self.nodes * self.expected.makespan_s

    @property
    def idle_share(self) -> float:
        """1 − busy ÷ allocated node-seconds, at the expected times (0 for an empty allocation)."""
        allocated = self.allocated_node_s
        return 1.0 - self.busy_node_s / allocated if allocated > 0 else 0.0

    @property
    def lower_bound_s(self) -> float:
        """No packing of these points on these nodes ends sooner (expected times)."""
        longest = max((task.expected_s for task in self.order), default=0.0)
        return max(longest, self.busy_node_s / self.nodes)


@dataclass(frozen=True, kw_only=True)
class Packing:
    nodes: int
    max_time_s: float | None
    allocations: tuple[Allocation, ...]

    @property
    def points(self) -> int:
        return sum(len(a.order) for a in self.allocations)

    @property
    def busy_node_s(self) -> float:
        return sum(a.busy_node_s for a in self.allocations)

    @property
    def allocated_node_s(self) -> float:
        return sum(a.allocated_node_s for a in self.allocations)

    @property
    def idle_share(self) -> float:
        """Idle node-seconds ÷ allocated node-seconds over all allocations, at the expected times."""
        allocated = self.allocated_node_s
        return 1.0 - self.busy_node_s / allocated if allocated > 0 else 0.0

    @property
    def makespan_s(self) -> float:
        """The allocations one after another (the least a user gets when they do not run side by side)."""
        return sum(a.expected.makespan_s for a in self.allocations)


def priority(task: Task) -> tuple:
    """The packing's order: widest first, then longest (at its limit), then by id."""
    return (-task.nodes, -task.limit_s, task.key)


def pack(tasks: Iterable[Task], nodes: int, *, max_time_s: float | None = None, pinned_serial: bool = False) -> Packing:
    """Pack `tasks` into allocations of `nodes` nodes whose worst-case makespan stays within `max_time_s`;
    `pinned_serial`: pinned points run one at a time (their nodes share something a measurement feels)."""
    tasks = sorted(tasks, key=priority)
    if nodes < 1:
        raise DdlbenchError(f"--pack {nodes}: an allocation needs at least 1 node")
    _check_fits(tasks, nodes, max_time_s)
    pinned = [task for task in tasks if task.node]
    free = [task for task in tasks if not task.node]
    allocations: list[Allocation] = []
    # pinned points go in allocations of their own nodes, `nodes` of them at most each (a partition
    # larger than one allocation is certified chunk by chunk); the others in allocations of `nodes`
    names = sorted({task.node for task in pinned})
    for start in range(0, len(names), nodes):
        chunk = set(names[start : start + nodes])
        members = [task for task in pinned if task.node in chunk]
        _fill(allocations, members, len(chunk), tuple(sorted(chunk)), max_time_s, serial=pinned_serial)
    _fill(allocations, free, nodes, (), max_time_s, serial=False)
    return Packing(nodes=nodes, max_time_s=max_time_s, allocations=tuple(allocations))


def pack_into(
    tasks: Iterable[Task], hosts: Sequence[str], *, max_time_s: float | None, serial: bool = False
) -> tuple[Allocation, list[Task]]:
    """Pack `tasks` into one allocation already held (`ddlbench run-packed --configfile` inside it): its
    `hosts`, `max_time_s` left of it (None: no end known). The same rule as `pack`, pinned and free points
    side by side on the same nodes (`serial`: one at a time); the tasks that do not fit the time come
    back in order, for the dispatcher to start after the others only where their limit still fits."""
    tasks = sorted(tasks, key=priority)
    for task in tasks:
        if task.nodes > len(hosts):
            raise DdlbenchError(f"point {task.key} needs {task.nodes} nodes; this allocation has {len(hosts)}")
    _check_fits(tasks, len(hosts), None)
    absent = sorted({task.node for task in tasks if task.node} - set(hosts))
    if absent:
        raise DdlbenchError(f"points pinned to {', '.join(absent)}: not in this allocation ({','.join(hosts)})")
    worst, deferred = simulate(tasks, hosts, which="limit", deadline_s=max_time_s, serial=serial)
    taken = {p.key for p in worst.placements}
    order = tuple(task for task in tasks if task.key in taken)
    expected, _ = simulate(order, hosts, which="expected", serial=serial)
    allocation = Allocation(
        index=0, nodes=len(hosts), named=tuple(hosts), order=order, serial=serial, worst=worst, expected=expected
    )
    return allocation, deferred


def _check_fits(tasks: Sequence[Task], nodes: int, max_time_s: float | None) -> None:
    for task in tasks:
        if task.nodes > nodes:
            raise DdlbenchError(
                f"point {task.key} needs {task.nodes} nodes, more than the {nodes} of one allocation; "
                f"pack at least {max(t.nodes for t in tasks)} nodes (--pack auto)"
            )
        if task.node and task.nodes != 1:
            raise DdlbenchError(f"point {task.key} is pinned to node {task.node} but needs {task.nodes} nodes")
        if max_time_s is not None and task.limit_s > max_time_s:
            raise DdlbenchError(
                f"point {task.key} may run {task.limit_s:g} s (its timeout), over the {max_time_s:g} s an "
                "allocation may last; lower its timeout_s or allow longer allocations"
            )


def _fill(
    allocations: list[Allocation],
    tasks: list[Task],
    nodes: int,
    named: tuple[str, ...],
    max_time_s: float | None,
    *,
    serial: bool,
) -> None:
    """Append allocations until every task of `tasks` (in priority order) has one."""
    left = tasks
    while left:
        slots = named or tuple(f"#{i}" for i in range(nodes))
        worst, deferred = simulate(left, slots, which="limit", deadline_s=max_time_s, serial=serial)
        taken = {p.key for p in worst.placements}
        order = tuple(task for task in left if task.key in taken)
        expected, _ = simulate(order, slots, which="expected", serial=serial)
        allocations.append(
            Allocation(
                index=len(allocations),
                nodes=nodes,
                named=named,
                order=order,
                serial=serial,
                worst=worst,
                expected=expected,
            )
        )
        left = deferred


def simulate(
    order: Sequence[Task], slots: Sequence[str], *, which: str, deadline_s: float | None = None, serial: bool = False
) -> tuple[Schedule, list[Task]]:
    """The greedy list schedule of `order` on `slots` with each task's `which` duration: at time 0 and at
    every end, the first waiting tasks (in order) that fit the free slots start. A task that would end
    after `deadline_s` is not started; those come back, in order, as the second value. `serial`: a task
    starts only when none runs.

    Waiting tasks are kept in one queue per width (and per pinned node), so choosing the next task costs
    the number of distinct widths, not the number of tasks."""
    rank = {task.key: i for i, task in enumerate(order)}
    queues: dict[object, deque[Task]] = {}
    for task in order:
        queues.setdefault(task.node or task.nodes, deque()).append(task)
    free = sorted(slots, key=_slot_key)
    free_set = set(free)
    running: list[tuple[float, int, Placement]] = []
    placements: list[Placement] = []
    deferred: list[Task] = []
    now = 0.0
    while True:
        while not (serial and running):
            best_key, best = None, None
            for key, queue in queues.items():
                while queue:
                    head = queue[0]
                    if deadline_s is not None and now + head.duration(which) > deadline_s + 1e-9:
                        deferred.append(queue.popleft())  # later starts end later still
                        continue
                    break
                if not queue:
                    continue
                fits = (head.node in free_set) if head.node else (head.nodes <= len(free))
                if fits and (best is None or rank[head.key] < rank[best.key]):
                    best_key, best = key, head
            if best is None:
                break
            queues[best_key].popleft()
            if best.node:
                taken = (best.node,)
                free.remove(best.node)
            else:
                unnamed = [slot for slot in free if slot.startswith("#")] or free
                taken = tuple(unnamed[: best.nodes])
                for slot in taken:
                    free.remove(slot)
            free_set.difference_update(taken)
            placement = Placement(key=best.key, start_s=now, end_s=now + best.duration(which), slots=taken)
            placements.append(placement)
            heapq.heappush(running, (placement.end_s, rank[best.key], placement))
        queues = {key: queue for key, queue in queues.items() if queue}
        if not running:
            break
        now, _, done = heapq.heappop(running)
        ended = [done]
        while running and running[0][0] <= now:
            ended.append(heapq.heappop(running)[2])
        for placement in ended:
            free.extend(placement.slots)
            free_set.update(placement.slots)
        free.sort(key=_slot_key)
    deferred.extend(task for queue in queues.values() for task in queue)
    deferred.sort(key=lambda task: rank[task.key])
    return Schedule(which=which, placements=tuple(placements)), deferred


def _slot_key(slot: str) -> tuple:
    return (0, int(slot[1:]), "") if slot.startswith("#") else (1, 0, slot)
