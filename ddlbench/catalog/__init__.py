"""Registries of models, datasets and strategies by name, with their facts and no torch import.

Planning, validation and reporting need the names and facts of what can run, but must stay fast
and light on a login node, so the torch code behind each entry is named here as "module:function"
and imported only when a rank builds it (`resolve_builder`). The entries themselves are registered
by `ddlbench.catalog.models`, `.datasets` and `.strategies`, imported at the end of this module.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

NAME_PATTERN = re.compile(r"^[a-z0-9_]+$")

# What a model consumes: N×C×H×W images, N×C×D×H×W volumes, or N×T token ids.
InputKind = Literal["image2d", "volume3d", "tokens"]
# How a strategy may cut a model: CNNs over images or volumes, or a decoder-only transformer.
Family = Literal["cnn2d", "cnn3d", "transformer"]
# What the targets are, which fixes the loss: class ids (cross-entropy), real vectors (mean squared
# error), or the next token at every position (cross-entropy over all positions).
Task = Literal["classify", "regress", "language"]


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Facts about a model: what it consumes, how it can be cut, and which options it accepts.

    Every model is built as a flat nn.Sequential of `blocks` top-level children, each mapping one
    tensor to one tensor, so pipeline and model-parallel strategies can cut it between children.
    """

    name: str
    builder: str  # "module:function"; called as builder(sample_shape=, num_outputs=, **options)
    family: Family
    input_kind: InputKind
    default_batch_size: int
    description: str
    blocks: int  # top-level children of the built nn.Sequential: the most pipeline stages it allows
    parameters: str = ""  # approximate parameter count on its reference dataset, for people ("11.7M")
    # option name -> allowed values; the first value is the default
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # transformer shape facts strategies check divisibility against: heads, d_model, layers
    shape: Mapping[str, int] = field(default_factory=dict)

    def default_options(self) -> dict[str, str]:
        return {key: values[0] for key, values in self.options.items()}


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """Facts about a dataset: the shape of one sample, its targets, and which real data it can read."""

    name: str
    input_kind: InputKind
    sample_shape: tuple[int, ...]  # C×H×W (image2d), C×D×H×W (volume3d), (T,) (tokens)
    task: Task
    num_outputs: int  # classes (classify), target values (regress), vocabulary size (language)
    description: str
    real_data: str = ""  # what a `data:` path may point at, in words; "" when only synthetic
    train_samples: int | None = None  # the real training set's size (an epoch), when there is one

    @property
    def num_classes(self) -> int:
        return self.num_outputs


@dataclass(frozen=True, kw_only=True)
class OptionSpec:
    """One option of a strategy: a default and either a closed set of choices or a positive number."""

    default: str
    description: str
    choices: tuple[str, ...] = ()  # empty: any positive number is accepted

    def check(self, value: str) -> str | None:
        """None when value is accepted, else why not."""
        if self.choices:
            return None if value in self.choices else f"choose from: {', '.join(self.choices)}"
        try:
            number = float(value)
        except ValueError:
            return "must be a positive number"
        return None if number > 0 and number == number and number != float("inf") else "must be a positive number"


@dataclass(frozen=True, kw_only=True)
class StrategySpec:
    """Facts about a parallelism strategy: how it lays ranks out and what it can split.

    `mesh` names the device-mesh dimensions, outermost first: ("dp",) is pure data parallelism,
    ("pp",) a model cut over all ranks, ("dp", "pp") a 2-D mesh of data-parallel replicas each cut
    over `split` ranks. Non-dp dimensions: pp (pipeline stages), tp (tensor), sp (spatial),
    fp (filter), cp (channel), mp (plain model parallel).
    """

    name: str
    builder: str  # "module:function"; parallelize_<name>(model, setup) -> Trainer
    description: str
    mesh: tuple[str, ...]
    families: tuple[Family, ...] = ("cnn2d", "cnn3d", "transformer")
    micro_batched: bool = False  # consumes the micro_batches axis
    stages_per_rank: int = 0  # pipeline stages each rank of the pp dimension holds (0: not a pipeline)
    options: Mapping[str, OptionSpec] = field(default_factory=dict)
    needs: str = ""  # an optional package it requires at run time, and the set-up step that installs it
    # takes the model on the meta device and materialises only this rank's shards (ddlbench.train.models.init)
    materialises_shards: bool = False
    # execution options it cannot honour, each with the reason the plan gives for skipping it:
    # "precision=<value>" (Point.precision), "channels_last" or "compile"; ddlbench.train.execution
    refuses: Mapping[str, str] = field(default_factory=dict)

    @property
    def data_parallel(self) -> bool:
        """Ranks (or groups of ranks) consume different slices of the global batch."""
        return "dp" in self.mesh

    @property
    def split_dim(self) -> str | None:
        """The mesh dimension that cuts one model replica over ranks (None for pure data parallelism)."""
        rest = [dim for dim in self.mesh if dim != "dp"]
        return rest[0] if rest else None

    def default_options(self) -> dict[str, str]:
        return {key: option.default for key, option in self.options.items()}


Spec = TypeVar("Spec", ModelSpec, DatasetSpec, StrategySpec)


class Registry(Generic[Spec]):
    """Named entries of one kind; refuses duplicates and names the known entries on a miss."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Spec] = {}

    def register(self, spec: Spec) -> Spec:
        if not NAME_PATTERN.match(spec.name):
            raise ValueError(f"{self.kind} name {spec.name!r} must match {NAME_PATTERN.pattern}")
        if spec.name in self._entries:
            raise ValueError(f"{self.kind} {spec.name!r} registered twice")
        self._entries[spec.name] = spec
        return spec

    def get(self, name: str) -> Spec:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; known {self.kind}s: {', '.join(self.names())}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries


MODELS: Registry[ModelSpec] = Registry("model")
DATASETS: Registry[DatasetSpec] = Registry("dataset")
STRATEGIES: Registry[StrategySpec] = Registry("strategy")


def resolve_builder(reference: str) -> Callable[..., Any]:
    """Import the function named by a "module:function" reference."""
    module_name, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


# the entries register themselves on import; they need the classes above, hence the late import
from ddlbench.catalog import datasets, models, strategies  # noqa: E402,F401
