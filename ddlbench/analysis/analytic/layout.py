"""What a point asks of the analytical model, and the facts about its ranks every strategy model needs.

`Setting` is the part of a sweep point (ddlbench.point.Point) a prediction depends on, so the oracle
can ask about configurations that are not points of any sweep. Ranks are numbered node-major (rank =
node × ranks_per_node + local rank), and a strategy's inner groups (tensor, pipeline, ParaDL splits)
are consecutive ranks, as ddlbench.train.strategies.common.build_mesh lays them out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ddlbench.analysis.analytic.layers import ModelTable
from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.simulate import Program, Timeline, simulate
from ddlbench.catalog import STRATEGIES


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One configuration to predict (the fields of ddlbench.point.Point that matter)."""

    model: str
    dataset: str
    strategy: str
    nodes: int
    ranks_per_node: int
    batch_size: int  # samples per model replica per step
    threads: int = 1
    micro_batches: int = 1
    split: int = 1  # ranks sharing one replica (pipeline stages, tensor/ParaDL parts)
    precision: str = "fp32"
    model_options: tuple[tuple[str, str], ...] = ()
    strategy_options: tuple[tuple[str, str], ...] = ()
    point_id: str = ""

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def replicas(self) -> int:
        return self.world_size // self.split

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.replicas

    def options(self) -> dict[str, str]:
        """The strategy's options with its defaults filled in (as Point.resolved_strategy_options)."""
        return STRATEGIES.get(self.strategy).default_options() | dict(self.strategy_options)

    def option(self, key: str) -> str:
        return self.options()[key]

    @classmethod
    def of_point(cls, point) -> Setting:  # ddlbench.point.Point; not imported: analysis stays below launch
        return cls(
            model=point.model,
            dataset=point.dataset,
            strategy=point.strategy,
            nodes=point.nodes,
            ranks_per_node=point.ranks_per_node,
            batch_size=point.batch_size,
            threads=point.threads,
            micro_batches=point.micro_batches,
            split=point.split,
            precision=point.precision,
            model_options=tuple(point.model_options),
            strategy_options=tuple(point.strategy_options),
            point_id=point.point_id,
        )


@dataclass(frozen=True, kw_only=True)
class Context:
    """A setting with the model's table and the machine: what a strategy model reads."""

    setting: Setting
    table: ModelTable
    machine: MachineModel
    notes: list[str] = field(default_factory=list)
    sharing: int = 1  # ranks computing at once on one node (one host: every rank of a local run)

    @property
    def overlap(self) -> bool:
        """Whether communication can progress while the rank computes. On a GPU, NCCL runs beside the
        kernels; on a CPU only when a core is left over for the communication thread: ranks × threads on
        the node below its cores (the machine's `per_node`)."""
        if self.machine.device_kind != "cpu":
            return True
        return self.sharing * self.setting.threads < self.machine.per_node

    def simulate(self, program: Program) -> Timeline:
        if not self.overlap:
            note = "no core is left for communication: it runs in the ranks' compute streams, unhidden"
            if note not in self.notes:
                self.notes.append(note)
        return simulate(program, overlap=self.overlap)

    def nodes_spanned(self, ranks: Sequence[int]) -> int:
        return len({rank // self.setting.ranks_per_node for rank in ranks})

    def inner_group(self, size: int) -> list[int]:
        """Rank 0's group of `size` consecutive ranks (a replica's stages or parts)."""
        return list(range(size))

    def outer_group(self, size: int, stride: int) -> list[int]:
        """Rank 0's group of `size` ranks `stride` apart (the same part of every replica)."""
        return [k * stride for k in range(size)]

    def collective_s(self, op: str, nbytes: float, ranks: Sequence[int]) -> float:
        """Seconds of `op` on `nbytes` (the calibration's convention) over the group `ranks`."""
        if len(ranks) <= 1 or nbytes <= 0:
            return 0.0
        cost = self.machine.collective(op, ranks=len(ranks), nodes=self.nodes_spanned(ranks))
        note = f"{op} over {len(ranks)} ranks on {self.nodes_spanned(ranks)} node(s): {cost.source}"
        if note not in self.notes:
            self.notes.append(note)
        return cost.time_s(nbytes)

    def send_s(self, nbytes: float, src: int, dst: int) -> float:
        """Seconds to send `nbytes` from rank src to rank dst (point-to-point)."""
        return self.collective_s("send_recv", nbytes, [src, dst])


def block_params(table: ModelTable) -> list[int]:
    return [block.params for block in table.blocks]


def element_bytes(precision: str) -> int:
    """Bytes of an activation crossing a stage boundary: autocast's dtype (ContiguousStage.to_boundary)."""
    return 2 if precision in ("bf16", "fp16") else 4


def elements(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1
