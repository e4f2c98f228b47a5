"""Steps on one clock: each rank's timer mapped onto rank 0's, and step intervals taken on it.

Offsets are estimated by Cristian's algorithm: a rank sends a message to rank 0 at t0 (its clock),
rank 0 answers with its own time T, the answer arrives at t1; then rank 0's clock ≈ this rank's
clock + (T − (t0 + t1)/2), wrong by at most (t1 − t0)/2. The exchange with the shortest round trip of
`ROUNDS` wins. The timer is time.perf_counter (CLOCK_MONOTONIC on Linux: ns resolution, never
stepped by NTP); on one host all ranks share it and the offsets come out near zero, across hosts
they carry the difference of the hosts' boot times.

On CUDA a step is timed by events recorded on the current stream, with no host synchronisation
inside the measured window; one synchronisation after it, then every event is placed on the host
clock through an anchor event completed (and synchronised) just before the window. The events are
made before the window (an event's first record creates it) and recorded on a stream looked up once:
on an H200 (torch 2.11, 2026-11-28, benchmarks/gpu_probe.py) a fresh event and its record cost 7.7 µs
of host time, a made one recorded on the current stream 6.3 µs (looking the stream up is 4.0 µs of it),
on a stream at hand 1.7 µs. Consecutive steps share their boundary: one event per step, as nothing
is queued on the stream between one step's end and the next one's start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

ROUNDS = 8


@dataclass(frozen=True, kw_only=True)
class ClockOffset:
    offset_s: float  # add to this rank's perf_counter to get rank 0's
    uncertainty_s: float  # half the round trip of the exchange used


def estimate_offset(rank: int, world_size: int, group: dist.ProcessGroup | None = None) -> ClockOffset:
    """Every rank's offset to rank 0; a collective (all ranks must call it). Rank 0 gets (0, 0)."""
    buffer = torch.zeros(1, dtype=torch.float64)
    best = ClockOffset(offset_s=0.0, uncertainty_s=0.0)
    for peer in range(1, world_size):
        if rank == 0:
            for _ in range(ROUNDS):
                dist.recv(buffer, src=peer, group=group)
                buffer[0] = time.perf_counter()
                dist.send(buffer, dst=peer, group=group)
        elif rank == peer:
            candidates = []
            for _ in range(ROUNDS):
                sent = time.perf_counter()
                dist.send(buffer, dst=0, group=group)
                dist.recv(buffer, src=0, group=group)
                received = time.perf_counter()
                candidates.append((received - sent, float(buffer[0]) - (sent + received) / 2))
            round_trip, offset = min(candidates)
            best = ClockOffset(offset_s=offset, uncertainty_s=round_trip / 2)
    return best


def host_group(backend: str) -> dist.ProcessGroup | None:
    """A CPU (gloo) group for the clock exchange: NCCL would add kernel launches to the round trip."""
    return None if backend == "gloo" else dist.new_group(backend="gloo")


class StepTimer:
    """Start and end of each measured step on this rank's host clock (seconds of perf_counter).

    On the CPU, `start()` and `end()` read perf_counter. On CUDA they record events made in
    `open_window(steps)`; a `start()` right after an `end()` takes that end's event (the stream reaches
    both at the same point), so back-to-back steps cost one event each."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.on_cuda = device.type == "cuda"
        self._starts: list = []
        self._ends: list = []
        self._anchor_event = None
        self._anchor_s = 0.0
        self._pool: list = []
        self._stream = None
        self._last_was_end = False

    @property
    def name(self) -> str:
        return "cuda_events" if self.on_cuda else "perf_counter"

    def open_window(self, steps: int = 0) -> None:
        """Before the first step; on CUDA, makes the events of `steps` back-to-back steps (more are made
        on demand, at the cost measured above)."""
        if not self.on_cuda:
            return
        self._stream = torch.cuda.current_stream(self.device)
        self._pool = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        for event in self._pool:
            event.record(self._stream)  # the first record creates the event, here rather than in a step
        self._pool.reverse()  # popped from the end, in the order made
        torch.cuda.synchronize(self.device)
        self._anchor_event = torch.cuda.Event(enable_timing=True)
        self._anchor_event.record(self._stream)
        torch.cuda.synchronize(self.device)
        self._anchor_s = time.perf_counter()

    def start(self) -> None:
        if self.on_cuda and self._last_was_end:
            self._starts.append(self._ends[-1])
        else:
            self._starts.append(self._mark())
        self._last_was_end = False

    def end(self) -> None:
        self._ends.append(self._mark())
        self._last_was_end = True

    def _mark(self):
        if not self.on_cuda:
            return time.perf_counter()
        event = self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)
        event.record(self._stream)
        return event

    def close_window(self) -> tuple[list[float], list[float]]:
        """Synchronise once, then the starts and ends in seconds of this rank's host clock."""
        if not self.on_cuda:
            return list(self._starts), list(self._ends)
        torch.cuda.synchronize(self.device)
        anchor = self._anchor_event
        seconds: dict[int, float] = {}

        def host(event) -> float:  # elapsed_time is in ms; a shared boundary is read once
            key = id(event)
            if key not in seconds:
                seconds[key] = self._anchor_s + anchor.elapsed_time(event) / 1000.0
            return seconds[key]

        return [host(e) for e in self._starts], [host(e) for e in self._ends]
