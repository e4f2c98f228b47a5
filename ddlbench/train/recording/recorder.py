"""One rank's phases and collectives during its measured steps, and the per-step figures made of them.

What is stamped (seconds of the rank's perf_counter; on CUDA, events on the current stream placed on
that clock after the window, as the step timer does, ddlbench.train.clock):
- phases, on the rank's thread: `data` (waiting for the next batch), `forward` (forward pass and loss,
  i.e. Execution.autocast()), `backward` (Execution.backward, or a pipeline stage's backward of one
  micro-batch), `update` (Execution.optimizer_step). Only the outermost phase counts: a forward
  recomputed inside backward is backward.
- collectives (ddlbench.train.recording.comms): issued at, completed at (observed from the collective's
  future where it has one; else the end of the last wait on it, an upper bound), and the intervals
  the thread spent blocked on it (a synchronous call's whole duration, a wait, DDP's wait for its
  last buckets at the end of backward). A future's callback runs on the backend's thread and needs the
  GIL: while the rank's thread runs Python, an observed completion is stamped late by up to the
  interpreter's switch interval (sys.getswitchinterval(), 5 ms by default); waits, phases and steps,
  stamped on the rank's thread, are not affected.

Figures of one step on one rank, in seconds unless named otherwise (`StepAnatomy`); |X| is the
total length of a union of intervals, clipped to the step:
- step_s: the rank's step, start to end;
- comm_s = |in flight ∪ blocked|, in flight = ∪ [issued, completed] over the step's collectives (a
  wait may end after the completion its future reported);
- comm_exposed_s = |blocked|: time the thread waited on communication;
- comm_hidden_s = |in flight \\ blocked| = comm_s − comm_exposed_s: communication that ran while the
  thread computed (hidden under backward in data parallelism);
- overlap = comm_hidden_s / comm_s (dimensionless; none without communication);
- data_s, forward_s, backward_s, update_s: |phase \\ blocked|: the phase's own work, its waits on
  communication taken out; exposed_<phase>_s = |phase ∩ blocked|;
- other_s = step_s − (data_s + forward_s + backward_s + update_s + comm_exposed_s): what lies outside
  the phases (zeroing gradients, the strategy's bookkeeping, an injected delay);
- busy_s = step_s − comm_exposed_s: the time the rank was not waiting for its peers (compared over ranks
  to find stragglers in ddlbench.analysis.inside.figures);
- exposed_p2p_s = |blocked on point-to-point transfers|: a pipeline stage's wait for its neighbours,
  its bubble;
- comm_ops, comm_bytes: collectives issued and the bytes of their local buffers;
- update_start, update_end: the first update's start and the last update's end (the gap between two
  updates is computed over steps, on the common clock).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ddlbench.records import ANATOMY_FIGURES

PHASES = ("data", "forward", "backward", "update")
P2P_OPS = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})
FIGURES = ANATOMY_FIGURES  # per-step figures a rank records, in this order (StepAnatomy.figures)


@dataclass(kw_only=True)
class CommEvent:
    """One collective or transfer as the rank saw it."""

    op: str  # torch.distributed's name (all_reduce, reduce_scatter_tensor, send…), or ddp_bucket, horovod_allreduce
    nbytes: int  # bytes of this rank's buffer(s)
    issued: Any  # a stamp (float, or a CUDA event until resolved)
    phase: str  # the phase open when it was issued ("other" outside every phase)
    completed: Any = None  # observed completion (a future's callback), or None
    waits: list[tuple[Any, Any]] = field(default_factory=list)  # intervals the thread blocked on it
    group_size: int = 0  # ranks of the group (0: not known), for the timeline
    tail: bool = False  # DDP bucket: the thread blocks from the last bucket's issue until all complete

    @property
    def is_p2p(self) -> bool:
        return self.op in P2P_OPS


@dataclass(kw_only=True)
class _Step:
    index: int
    start: Any
    end: Any = None
    phases: list[tuple[str, Any, Any]] = field(default_factory=list)
    comms: list[CommEvent] = field(default_factory=list)


class IterationRecorder:
    """Stamps of the measured steps of one rank; `figures()` turns them into StepAnatomy figures."""

    def __init__(self, *, clock: Any = None, comms_traced: bool = True) -> None:
        self.clock = clock or HostClock()
        self.recording = False
        self.steps: list[_Step] = []
        self._step: _Step | None = None
        self._open: str | None = None  # the outermost open phase
        self._thread = threading.get_ident()
        self.comms_traced = comms_traced  # False on CUDA: collectives are not stamped (ddlbench.train.kernel)

    # -- the window and its steps (the kernel) ---------------------------------------------------------------
    def open_window(self) -> None:
        self.clock.open()
        self.recording = True

    def close_window(self) -> None:
        self.recording = False
        self.clock.close()

    def begin_step(self, index: int) -> None:
        if self.recording:
            self._step = _Step(index=index, start=self.clock.stamp())

    def end_step(self) -> None:
        if self._step is not None:
            self._step.end = self.clock.stamp()
            self.steps.append(self._step)
            self._step = None

    # -- phases (the rank's thread) ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, kind: str) -> Iterator[None]:
        step = self._step
        if step is None or self._open is not None or threading.get_ident() != self._thread:
            yield
            return
        self._open = kind
        start = self.clock.stamp()
        try:
            yield
        finally:
            step.phases.append((kind, start, self.clock.stamp()))
            self._open = None

    # -- communication (ddlbench.train.recording.comms) ---------------------------------------------------------
    def comm_issued(self, op: str, nbytes: int, group_size: int = 0, *, tail: bool = False) -> CommEvent | None:
        if self._step is None or not self.comms_traced:
            return None
        event = CommEvent(
            op=op,
            nbytes=nbytes,
            issued=self.clock.stamp(),
            phase=self._open or "other",
            group_size=group_size,
            tail=tail,
        )
        self._step.comms.append(event)
        return event

    def comm_completed(self, event: CommEvent | None) -> None:
        """Called from any thread (a future's callback runs on the backend's)."""
        if event is not None and event.completed is None:
            event.completed = self.clock.host_stamp()

    @contextlib.contextmanager
    def blocked(self, event: CommEvent | None) -> Iterator[None]:
        if event is None:
            yield
            return
        start = self.clock.stamp()
        try:
            yield
        finally:
            event.waits.append((start, self.clock.stamp()))

    def mark(self) -> Any:
        return self.clock.stamp()

    # -- figures --------------------------------------------------------------------------------------------
    def figures(self) -> StepAnatomy:
        """Per-step figures of every recorded step (after close_window)."""
        resolve = self.clock.resolve
        rows = [_step_figures(step, resolve) for step in self.steps]
        return StepAnatomy(
            figures={name: tuple(row[name] for row in rows) for name in FIGURES},
            update_starts=tuple(row["update_start"] for row in rows),
            update_ends=tuple(row["update_end"] for row in rows),
            completions={how: sum(row["completions"][how] for row in rows) for how in ("observed", "waited", "none")},
        )

    def events(self, index: int) -> list[dict[str, Any]]:
        """The stamps of step `index` as timeline events (seconds of the rank's clock): phases, collectives
        in flight, and waits on them."""
        resolve = self.clock.resolve
        step = next((s for s in self.steps if s.index == index), None)
        if step is None:
            return []
        events = [{"cat": "step", "name": f"step {index}", "start": resolve(step.start), "end": resolve(step.end)}]
        for kind, start, end in step.phases:
            events.append({"cat": "phase", "name": kind, "start": resolve(start), "end": resolve(end)})
        step_end = resolve(step.end)
        for comm in step.comms:
            issued = resolve(comm.issued)
            end, how = _completion(comm, resolve, step_end)
            args = {"bytes": comm.nbytes, "ranks": comm.group_size, "phase": comm.phase, "completion": how}
            events.append({"cat": "comm", "name": comm.op, "start": issued, "end": end, "args": args})
            for start, stop in _waits(comm, resolve):
                events.append({"cat": "wait", "name": f"wait {comm.op}", "start": start, "end": stop})
        return events


@dataclass(frozen=True, kw_only=True)
class StepAnatomy:
    """The per-step figures of one rank's measured steps (definitions: the module docstring)."""

    figures: dict[str, tuple[float, ...]]
    update_starts: tuple[float | None, ...]  # rank clock; None in a step without an update
    update_ends: tuple[float | None, ...]
    # collectives whose completion was observed (a future), bounded by the end of a wait on them, or by neither
    # (counted complete at the step's end)
    completions: dict[str, int]


class HostClock:
    """perf_counter stamps: for CPU ranks, whose host thread does the work it marks."""

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    @staticmethod
    def stamp() -> float:
        return time.perf_counter()

    @staticmethod
    def host_stamp() -> float:
        return time.perf_counter()

    @staticmethod
    def resolve(stamp: Any) -> float:
        return stamp


class CudaClock:
    """CUDA events on the current stream, placed on the host clock after the window through an anchor
    event completed just before it (as ddlbench.train.clock.StepTimer). A stamp is the time the stream
    reaches it, i.e. when the work queued before it has run. Events are made before the window
    (`POOL` of them, more on demand) and recorded on the stream looked up once (what each costs:
    ddlbench.train.clock)."""

    POOL = 64

    def __init__(self, device: Any) -> None:
        import torch

        self.torch, self.device = torch, device
        self.anchor: Any = None
        self.anchor_s = 0.0
        self.stream: Any = None
        self.pool: list[Any] = []

    def open(self) -> None:
        cuda = self.torch.cuda
        self.stream = cuda.current_stream(self.device)
        self.pool = [cuda.Event(enable_timing=True) for _ in range(self.POOL)]
        for event in self.pool:
            event.record(self.stream)  # the first record creates the event
        cuda.synchronize(self.device)
        self.anchor = cuda.Event(enable_timing=True)
        self.anchor.record(self.stream)
        cuda.synchronize(self.device)
        self.anchor_s = time.perf_counter()

    def close(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def stamp(self) -> Any:
        event = self.pool.pop() if self.pool else self.torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    @staticmethod
    def host_stamp() -> float:
        return time.perf_counter()

    def resolve(self, stamp: Any) -> float:
        if isinstance(stamp, float):
            return stamp
        return self.anchor_s + self.anchor.elapsed_time(stamp) / 1000.0  # elapsed_time is in ms


_CURRENT: IterationRecorder | None = None


def current() -> IterationRecorder | None:
    """The rank's recorder, if the kernel installed one (ddlbench.train.recording.install)."""
    return _CURRENT


def install(recorder: IterationRecorder | None) -> None:
    global _CURRENT
    _CURRENT = recorder


def phase(kind: str) -> contextlib.AbstractContextManager[None]:
    """Mark a phase on the rank's recorder; nothing when there is none or it is not recording."""
    recorder = _CURRENT
    if recorder is None or recorder._step is None:
        return contextlib.nullcontext()
    return recorder.phase(kind)


def wrap_in_phase(owner: Any, method: str, kind: str) -> None:
    """Make `owner.method` (an instance's bound method) run inside phase `kind`: for steps a library drives,
    such as a pipeline schedule calling its stage's forward_one_chunk and backward_one_chunk."""
    bound = getattr(owner, method)

    def in_phase(*args: Any, **kwargs: Any) -> Any:
        with phase(kind):
            return bound(*args, **kwargs)

    setattr(owner, method, in_phase)


# -- interval arithmetic ------------------------------------------------------------------------------------
def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same points as `intervals` (empty ones dropped)."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(intervals: list[tuple[float, float]]) -> float:
    return math.fsum(end - start for start, end in intervals)


def intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intersection of two unions (each sorted and disjoint)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _completion(comm: CommEvent, resolve: Any, step_end: float) -> tuple[float, str]:
    """When a collective completed, and how that is known."""
    if comm.completed is not None:
        return resolve(comm.completed), "observed"
    if comm.waits:
        return max(resolve(end) for _, end in comm.waits), "waited"
    return step_end, "none"


def _waits(comm: CommEvent, resolve: Any) -> list[tuple[float, float]]:
    return [(resolve(start), resolve(end)) for start, end in comm.waits]


def _step_figures(step: _Step, resolve: Any) -> dict[str, Any]:
    start, end = resolve(step.start), resolve(step.end)
    window = [(start, end)]
    in_flight, blocked, blocked_p2p = [], [], []
    completions = {"observed": 0, "waited": 0, "none": 0}
    backwards = [(resolve(s), resolve(e)) for k, s, e in step.phases if k == "backward"]

    def backward_end(t: float) -> float | None:
        return next((e for s, e in backwards if s <= t <= e), None)

    tail_issues, tail_dones = [], []
    for comm in step.comms:
        issued = resolve(comm.issued)
        done, how = _completion(comm, resolve, end)
        completions[how] += 1
        if comm.tail:
            # DDP's backward returns only once every bucket is done: a completion stamped later (its
            # callback waited for the GIL) is clipped to the end of the backward that issued the bucket
            limit = backward_end(issued)
            done = done if limit is None else min(done, limit)
            tail_issues.append(issued)
            tail_dones.append(done)
        in_flight.append((issued, done))
        waits = _waits(comm, resolve)
        blocked += waits
        if comm.is_p2p:
            blocked_p2p += waits
    # DDP: the thread waits in backward from its last bucket's issue (the end of its gradient computation)
    # until every bucket has completed; the bucket hooks cannot see that wait, so it is derived here
    if tail_issues:
        blocked.append((max(tail_issues), max(tail_dones)))
    # a wait can outlast the completion its future reported (the wake-up): waiting counts as communication
    in_flight_u = intersect(union(in_flight + blocked), window)
    blocked_u = intersect(union(blocked), window)
    figures: dict[str, Any] = {
        "step_s": end - start,
        "comm_s": length(in_flight_u),
        "comm_exposed_s": length(blocked_u),
        "exposed_p2p_s": length(intersect(union(blocked_p2p), window)),
        "comm_ops": len(step.comms),
        "comm_bytes": sum(comm.nbytes for comm in step.comms),
        "completions": completions,
    }
    figures["comm_hidden_s"] = length(in_flight_u) - length(intersect(in_flight_u, blocked_u))
    own = 0.0
    for kind in PHASES:
        spans = intersect(union([(resolve(s), resolve(e)) for k, s, e in step.phases if k == kind]), window)
        exposed = length(intersect(spans, blocked_u))
        figures[f"{kind}_s"] = length(spans) - exposed
        if kind != "data":
            figures[f"exposed_{kind}_s"] = exposed
        own += figures[f"{kind}_s"]
    figures["other_s"] = max(0.0, figures["step_s"] - own - figures["comm_exposed_s"])
    figures["busy_s"] = figures["step_s"] - figures["comm_exposed_s"]
    updates = [(resolve(s), resolve(e)) for k, s, e in step.phases if k == "update"]
    figures["update_start"] = min(s for s, _ in updates) if updates else None
    figures["update_end"] = max(e for _, e in updates) if updates else None
    return figures
