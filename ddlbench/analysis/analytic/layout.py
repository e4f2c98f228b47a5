"""What a point asks of the analytical model, and the facts about its ranks every strategy model needs.

`Setting` is a sweep point (ddlbench.point.Point) whose launch-only fields default, so the oracle can
ask about configurations that are not points of any sweep; its sizes are Point's. Ranks are numbered
node-major (rank = node × ranks_per_node + local rank), and a strategy's inner groups (tensor,
pipeline, ParaDL splits) are consecutive ranks, as ddlbench.train.strategies.common.build_mesh lays
them out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from ddlbench.analysis.analytic.machine_model import MachineModel
from ddlbench.analysis.analytic.simulate import Program, Timeline, simulate
from ddlbench.catalog import STRATEGIES
from ddlbench.catalog.model_table import LayerRow, ModelTable
from ddlbench.point import Point


@dataclass(frozen=True, kw_only=True)
class Setting(Point):
    """One configuration to predict: a Point whose fields a prediction does not read (the launch's
    repetition, steps, seed, learning rate, time limit) have defaults, so the oracle can ask about
    configurations no sweep made. Its sizes (world_size, replicas, global_batch_size) are Point's own.

    batch_size is per model replica; split the ranks sharing one replica (pipeline stages, tensor and
    ParaDL parts), as the sweep resolves it (ddlbench.sweep.resolve_layout): 1 for pure data
    parallelism, the world size for a model cut over every rank."""

    threads: int = 1
    repetition: int = 0
    warmup_steps: int = 0
    steps: int = 1
    seed: int = 0
    learning_rate: float = 0.0
    timeout_s: float = 0.0

    def __post_init__(self) -> None:
        # the strategy models read the layout from split and replicas alone: an inconsistent one would be
        # simulated as one layout and counted (global batch, samples/s) as another
        spec = STRATEGIES.get(self.strategy)
        if spec.split_dim is None and self.split != 1:
            raise ValueError(f"Setting {self.strategy} keeps one rank per replica: split must be 1, not {self.split}")
        if spec.split_dim is not None and not spec.data_parallel and self.split != self.world_size:
            raise ValueError(
                f"Setting {self.strategy} cuts one replica over all {self.world_size} ranks: split must be "
                f"{self.world_size}, not {self.split}"
            )

    def options(self) -> dict[str, str]:
        """The strategy's options with its defaults filled in (Point.resolved_strategy_options)."""
        return self.resolved_strategy_options()

    def option(self, key: str) -> str:
        return self.options()[key]

    @classmethod
    def of_point(cls, point: Point) -> Setting:
        """The point itself as a Setting: every field kept, so its point_id is the point's."""
        return cls(**{f.name: getattr(point, f.name) for f in fields(Point)})


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
        """Whether communication can progress while the rank computes, without a measured share (comm_share).
        On a GPU, NCCL runs beside the kernels; on a CPU only when a core is left over for the communication
        thread: ranks × threads on the node below its cores (the machine's `per_node`)."""
        if self.machine.device_kind != "cpu":
            return True
        return self.sharing * self.setting.threads < self.machine.per_node

    @property
    def comm_share(self) -> float | None:
        """On a CPU, the share of a rank's cores its collectives in flight take from its compute: the calibration's
        `beside` figure (MachineModel.comm_share). ddlbench pins each rank to its threads' cores
        (ddlbench.launch.cores; SLURM's --cpu-bind does the same) and gloo's threads run there too, so a collective
        overlaps the rank's compute and slows it by that share whether or not the node has a core to spare: the
        rule of `overlap` (a spare core hides it for free, none leaves it unhidden) is the figure's fallback. None
        on a GPU or without the figure."""
        if self.machine.device_kind != "cpu":
            return None
        return self.machine.comm_share

    @property
    def comm_stretch(self) -> float | None:
        """On a CPU, how much longer a collective runs beside the rank's compute than alone: its threads share the
        rank's cores with it (MachineModel.comm_stretch); None on a GPU, without the figure or without a share."""
        if self.comm_share is None:
            return None
        return self.machine.comm_stretch

    def simulate(self, program: Program) -> Timeline:
        share = self.comm_share
        if share is not None:
            note = (
                f"communication runs on the ranks' own cores: their compute runs at {1 - share:.2f} of its speed "
                f"while a collective is in flight (the calibration's beside share, {share:.2f})"
            )
            stretch = self.comm_stretch
            if stretch is not None:
                note += (
                    f", and a collective runs {stretch:.2f}× as long beside compute as alone (the median stretch; "
                    "each collective the calibration timed beside compute takes its own share and stretch)"
                )
            if note not in self.notes:
                self.notes.append(note)
            return simulate(program, comm_share=share, comm_stretch=stretch, comm_beside=self.machine.comm_beside)
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

    def collective_s(self, op: str, nbytes: float, ranks: Sequence[int], *, after_s: float = 0.0) -> float:
        """Seconds of `op` on `nbytes` (the calibration's convention) over the group `ranks`, called
        after `after_s` seconds of this rank's compute since its previous call."""
        if len(ranks) <= 1 or nbytes <= 0:
            return 0.0
        cost = self.machine.collective(op, ranks=len(ranks), nodes=self.nodes_spanned(ranks))
        note = f"{op} over {len(ranks)} ranks on {self.nodes_spanned(ranks)} node(s): {cost.source}"
        if note not in self.notes:
            self.notes.append(note)
        return cost.time_s(nbytes, after_s=after_s)

    def send_s(self, nbytes: float, src: int, dst: int, *, after_s: float = 0.0) -> float:
        """Seconds to send `nbytes` from rank src to rank dst (point-to-point)."""
        return self.collective_s("send_recv", nbytes, [src, dst], after_s=after_s)


def block_params(table: ModelTable) -> list[int]:
    return [block.params for block in table.blocks]


def layer_tensors(layer: LayerRow) -> int:
    """A layer's parameter tensors: its weight, and its bias where it owns more elements than the weight."""
    if not layer.params:
        return 0
    weight = math.prod(layer.weight_shape) if layer.weight_shape else 0
    return (1 if weight else 0) + (1 if layer.params > weight else 0)


def block_tensors(table: ModelTable) -> list[int]:
    """Parameter tensors per block (layer_tensors of its layers)."""
    counts = [0] * len(table.blocks)
    for layer in table.layers:
        counts[layer.block] += layer_tensors(layer)
    return counts


def element_bytes(precision: str) -> int:
    """Bytes of an activation crossing a stage boundary: autocast's dtype (ContiguousStage.to_boundary)."""
    return 2 if precision in ("bf16", "fp16") else 4


def elements(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1
