"""Registries of models, datasets and strategies by name, with their facts and no torch import.

Planning, validation and reporting need the names and facts of what can run, but must stay fast
and light on a login node, so the torch code behind each entry is named here as "module:function"
and imported only when a rank builds it (`resolve_builder`).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

NAME_PATTERN = re.compile(r"^[a-z0-9_]+$")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Facts about a model: what it consumes and which options it accepts."""

    name: str
    builder: str  # "module:function"; called as builder(in_channels=, num_classes=, **options)
    input_kind: str  # "image2d": takes N×C×H×W images and produces class logits
    default_batch_size: int
    description: str
    # option name -> allowed values; the first value is the default
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def default_options(self) -> dict[str, str]:
        return {key: values[0] for key, values in self.options.items()}


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """Facts about a dataset: the shape of one sample and the number of classes."""

    name: str
    input_kind: str
    sample_shape: tuple[int, ...]  # C×H×W for image2d
    num_classes: int
    description: str


@dataclass(frozen=True, kw_only=True)
class StrategySpec:
    """Facts about a parallelism strategy."""

    name: str
    builder: str  # "module:function"; parallelize_<name>(model, *, ctx, options)
    data_parallel: bool  # every rank holds a replica and consumes its own slice of the global batch
    description: str


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


# --- models ----------------------------------------------------------------------------------------
# CIFAR-style ResNets (He et al. 2016, section 4.2): depth 6n+2, three stages of 16/32/64 channels.
for _depth, _parameters in ((8, "78k"), (20, "272k")):
    MODELS.register(
        ModelSpec(
            name=f"resnet{_depth}",
            builder=f"ddlbench.train.models.cifar_resnet:build_resnet{_depth}",
            input_kind="image2d",
            default_batch_size=32,
            description=f"CIFAR ResNet-{_depth} (n={(_depth - 2) // 6}), {_parameters} parameters on CIFAR-10",
            options={"norm": ("batch", "group")},
        )
    )

# --- datasets (synthetic unless a path to real data is given; never downloaded) ----------------------
DATASETS.register(
    DatasetSpec(
        name="cifar10",
        input_kind="image2d",
        sample_shape=(3, 32, 32),
        num_classes=10,
        description="CIFAR-10-shaped images, 3×32×32, 10 classes",
    )
)
DATASETS.register(
    DatasetSpec(
        name="mnist",
        input_kind="image2d",
        sample_shape=(1, 28, 28),
        num_classes=10,
        description="MNIST-shaped images, 1×28×28, 10 classes",
    )
)

# --- strategies ------------------------------------------------------------------------------------
STRATEGIES.register(
    StrategySpec(
        name="ddp",
        builder="ddlbench.train.strategies.ddp:parallelize_ddp",
        data_parallel=True,
        description="data parallel with torch DistributedDataParallel (bucketed all-reduce)",
    )
)
