"""One benchmark run, as a value: its fields, its canonical spec and its stable id."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from ddlbench.catalog import STRATEGIES

POINT_ID_PATTERN = r"[a-z0-9_]+(?:-[a-z0-9_]+)*"


@dataclass(frozen=True, kw_only=True)
class Point:
    """One benchmark run: everything a launcher needs, and nothing that depends on where it runs."""

    model: str
    dataset: str
    strategy: str
    nodes: int
    ranks_per_node: int
    batch_size: int  # samples per rank per step
    threads: int
    repetition: int
    warmup_steps: int
    steps: int
    seed: int
    learning_rate: float
    timeout_s: float
    model_options: tuple[tuple[str, str], ...] = ()
    # fields below are left out of the canonical spec at their defaults, so points that do not use
    # them keep the ids (and records) they had before the fields existed
    micro_batches: int = 1  # pieces each replica's batch is cut into (pipelines); 1 elsewhere
    split: int = 1  # ranks that share one model replica (world size for model/pipeline/tensor/ParaDL splits)
    strategy_options: tuple[tuple[str, str], ...] = ()  # the strategy's options that differ from its defaults
    data_path: str = ""  # real data to read; "" is synthetic data
    # allow ranks × threads beyond the cores granted (locally: Snakemake's cores and the CPU affinity);
    # the record then says oversubscribed and the report marks its figures
    oversubscribe: bool = False
    # execution options (ddlbench.train.execution): numerics and layout of the step
    precision: str = "fp32"  # fp32 (strict), tf32, bf16 or fp16 (autocast; fp16 with a gradient scaler)
    channels_last: bool = False  # NHWC memory format for CNN weights and inputs
    compile: bool = False  # torch.compile the model
    # processes of each rank's DataLoader reading real data (0: read in the rank itself); always 0 for
    # synthetic data, which stays resident
    loader_workers: int = 0
    # the last trace_steps measured steps are written as a Chrome/Perfetto timeline beside the record
    # (ddlbench.launch.timeline); 0: none. A field, so a traced point is not compared as an untraced one
    trace_steps: int = 0
    # the one node a single-node point must run on (per-node certification: `each_node`; SLURM --nodelist,
    # locally this host's name); "" anywhere. A field, so each node's run is a configuration of its own
    node: str = ""
    # let ranks of a host share its GPUs where it has fewer than ranks (local rank r takes cuda:(r mod count),
    # and every rank meets over gloo: NCCL refuses two ranks on one device); off, such a point is refused
    share_gpus: bool = False
    # after the measured window, every rank trains the model alone for this many steps on the same samples
    # with deterministic kernels and records checksums (ddlbench.train.replay): the silent-data-corruption
    # check of certification, which names a GPU whose checksums differ from the others'. 0: no replay
    replay_steps: int = 0
    # the host allocator's policy for the ranks' processes (ddlbench.launch.command.allocator_env): "retain" tells
    # glibc to keep what it frees, "system" leaves the environment's allocator as it is (what every point ran
    # before the field existed)
    host_allocator: str = "system"

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    def resolved_strategy_options(self) -> dict[str, str]:
        """The strategy's options with its defaults filled in."""
        return STRATEGIES.get(self.strategy).default_options() | dict(self.strategy_options)

    @property
    def cores_per_rank(self) -> int:
        """Cores one rank keeps busy: its intra-op threads, plus its loader's worker processes."""
        return self.threads + self.loader_workers

    @property
    def replicas(self) -> int:
        """Data-parallel replicas of the model: world_size // split."""
        return replicas_of(world_size=self.world_size, split=self.split)

    @property
    def global_batch_size(self) -> int:
        """Samples consumed per optimizer step by the whole job: batch_size per replica times the replicas."""
        return global_batch_of(batch_size=self.batch_size, world_size=self.world_size, split=self.split)

    @functools.cached_property
    def spec_hash(self) -> str:
        """sha256 of the canonical spec: names exactly the configuration this point runs."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @functools.cached_property
    def point_id(self) -> str:
        """Readable, stable id: the axes, then a hash of every field, so a changed setting is a new point."""
        digest = self.spec_hash[:8]
        shape = f"-s{self.split}" if 1 < self.split < self.world_size else ""
        micro = f"-mb{self.micro_batches}" if self.micro_batches > 1 else ""
        execution = "".join(
            tag
            for tag, used in (
                (f"-{self.precision}", self.precision != "fp32"),
                ("-cl", self.channels_last),
                ("-compiled", self.compile),
                (f"-w{self.loader_workers}", self.loader_workers > 0),
                (f"-tr{self.trace_steps}", self.trace_steps > 0),
                (f"-rp{self.replay_steps}", self.replay_steps > 0),
                ("-sharedgpu", self.share_gpus),
                (f"-on_{node_tag(self.node)}", bool(self.node)),  # last: the certificate strips it by pattern
            )
            if used
        )
        return (
            f"{self.model}-{self.dataset}-{self.strategy}-n{self.nodes}x{self.ranks_per_node}{shape}"
            f"-b{self.batch_size}{micro}-t{self.threads}{execution}-r{self.repetition}-{digest}"
        )

    def to_dict(self) -> dict[str, Any]:
        # every field is a str, number, bool or a tuple of string pairs (made dicts below), so a shallow
        # copy is what dataclasses.asdict gives, without its deep copy of each value (most of a
        # 10,000-point plan's time in the Snakefile: benchmarks/plan_speed.py)
        data = {field.name: getattr(self, field.name) for field in _FIELDS}
        data["model_options"] = dict(self.model_options)
        data["strategy_options"] = dict(self.strategy_options)
        for name, default in _OMITTED_AT_DEFAULT.items():
            if data[name] == default:
                del data[name]
        return data

    def to_json(self) -> str:
        """Canonical compact JSON; the spec handed to `ddlbench run-point --spec`."""
        return self._json

    @functools.cached_property
    def _json(self) -> str:
        # cached (outside the fields, so equality is untouched): a 10,000-point plan asks for it 20,000 times
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Point:
        fields = dict(data)
        fields["model_options"] = tuple(sorted(dict(fields.get("model_options") or {}).items()))
        fields["strategy_options"] = tuple(sorted(dict(fields.get("strategy_options") or {}).items()))
        return cls(**fields)


_FIELDS = dataclasses.fields(Point)
_OMITTED_AT_DEFAULT: dict[str, Any] = {
    "micro_batches": 1,
    "split": 1,
    "strategy_options": {},
    "data_path": "",
    "oversubscribe": False,
    "precision": "fp32",
    "channels_last": False,
    "compile": False,
    "loader_workers": 0,
    "trace_steps": 0,
    "node": "",
    "share_gpus": False,
    "replay_steps": 0,
    "host_allocator": "system",
}


def replicas_of(*, world_size: int, split: int) -> int:
    """Data-parallel replicas of a model cut over `split` ranks among `world_size`: world_size // split.

    Point.replicas is this; it is a function of the raw fields for figures of configurations that are no
    Point (a series extrapolated to more nodes)."""
    return world_size // split


def global_batch_of(*, batch_size: int, world_size: int, split: int) -> int:
    """Samples per optimizer step of the whole job: batch_size per replica × replicas_of(world_size, split).

    THE global batch (Point.global_batch_size is this): what "the same global batch" means wherever
    strategies are compared (ddlbench.analysis.keys.comparison_key)."""
    return batch_size * replicas_of(world_size=world_size, split=split)


def node_tag(node: str) -> str:
    """A node name as a point id part: lower case, anything but [a-z0-9] as '_' (the digest tells apart
    names this folds together)."""
    return re.sub(r"[^a-z0-9]", "_", node.lower())


PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
