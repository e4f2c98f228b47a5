"""A model's facts layer by layer (the "model table"): shapes, parameters, FLOPs and saved activations.

The table is built from the real model by ddlbench.train.introspect (on the meta device, with torch) and
read, torch-free, by the analytical model (ddlbench.analysis.analytic) and `ddlbench model-table`'s
renderings (ddlbench.analysis.analytic.layers); it can be saved as JSON and read back here. All
per-sample figures are for one sample of the dataset, in fp32; FLOPs follow torch's FlopCounterMode
(2 per multiply-add of a convolution or matrix product, nothing for norms, pools and activations).

A row is one leaf module (a module without children), or the own operations of a module with children
that its children do not account for (`leaf=False`: the functional attention of a transformer block,
for instance), so that the rows add up to the whole model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from ddlbench.catalog import DATASETS, MODELS
from ddlbench.errors import DdlbenchError

Shape = tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class LayerRow:
    """One leaf module of a model (or a module's own operations outside its children), for one sample."""

    name: str  # module path in the model, e.g. "3.1.conv2"
    type: str  # class name, e.g. "Conv2d"
    block: int  # index of the top-level child it belongs to
    input_shape: Shape  # one sample's input (no batch dimension; batch-independent inputs as they are)
    output_shape: Shape  # one sample's output
    weight_shape: Shape  # () when the layer has no weight
    params: int  # parameter elements the module owns itself (weight + bias)
    forward_flops: int  # one sample, FlopCounterMode's convention (2 per multiply-add)
    backward_flops: int  # one sample (gradient of the input, where autograd needs it, and of the weights)
    saved_bytes: int  # one sample: bytes of tensors autograd keeps for backward, first saved here (fp32)
    saved_fixed_bytes: int = 0  # kept for backward whatever the batch size (batch norm's statistics, ids)
    kernel_size: Shape = ()  # pooling windows (an adaptive pool's effective one); () otherwise
    calls: int = 1  # forward calls per step (a shared ReLU is called several times; figures are summed)
    leaf: bool = True  # False: the own operations of a module with children
    # an attention's features per head (a module's `head_dim`), which its cost per score depends on; 0 for every
    # other row, and then left out of the JSON (so tables without attention read and write as before)
    head_features: int = 0


@dataclass(frozen=True, kw_only=True)
class BlockRow:
    """One top-level child of the model's nn.Sequential: the unit pipeline stages are cut at."""

    index: int
    input_shape: Shape  # one sample
    output_shape: Shape  # one sample
    output_dtype_bytes: int  # element size of the block's output (4 for fp32, 8 for int64 ids)
    params: int
    param_bytes: int
    buffer_bytes: int
    forward_flops: int  # one sample
    backward_flops: int  # one sample
    saved_bytes: int  # one sample, activations kept for backward by this block
    saved_fixed_bytes: int  # kept for backward independent of batch size (non-parameter), usually 0


@dataclass(frozen=True, kw_only=True)
class ModelTable:
    """A model built for a dataset, layer by layer and block by block, per sample."""

    SCHEMA_VERSION: ClassVar[int] = 1
    model: str
    dataset: str
    options: tuple[tuple[str, str], ...]  # model options resolved with defaults, sorted
    sample_shape: Shape
    layers: tuple[LayerRow, ...]
    blocks: tuple[BlockRow, ...]
    torch_version: str = field(default="", compare=False)  # which FlopCounterMode counted

    @property
    def params(self) -> int:
        return sum(block.params for block in self.blocks)

    @property
    def param_bytes(self) -> int:
        return sum(block.param_bytes for block in self.blocks)

    @property
    def buffer_bytes(self) -> int:
        return sum(block.buffer_bytes for block in self.blocks)

    @property
    def forward_flops(self) -> int:
        return sum(block.forward_flops for block in self.blocks)

    @property
    def backward_flops(self) -> int:
        return sum(block.backward_flops for block in self.blocks)

    @property
    def saved_bytes(self) -> int:
        return sum(block.saved_bytes for block in self.blocks)

    @property
    def saved_fixed_bytes(self) -> int:
        return sum(block.saved_fixed_bytes for block in self.blocks)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"] = dict(self.options)
        for row in data["layers"]:
            if not row["head_features"]:
                del row["head_features"]
        return {"schema_version": self.SCHEMA_VERSION, **data}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelTable:
        version = data.get("schema_version")
        if version != cls.SCHEMA_VERSION:
            raise DdlbenchError(f"model table schema version {version!r}; this ddlbench reads {cls.SCHEMA_VERSION}")
        return cls(
            model=data["model"],
            dataset=data["dataset"],
            options=tuple(sorted((str(k), str(v)) for k, v in data["options"].items())),
            sample_shape=tuple(data["sample_shape"]),
            layers=tuple(LayerRow(**_shapes_as_tuples(row)) for row in data["layers"]),
            blocks=tuple(BlockRow(**_shapes_as_tuples(row)) for row in data["blocks"]),
            torch_version=data.get("torch_version", ""),
        )


def _shapes_as_tuples(row: Mapping[str, Any]) -> dict[str, Any]:
    return {key: tuple(value) if isinstance(value, list) else value for key, value in row.items()}


def resolve_request(model: str, dataset: str, options: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """The model's options with its defaults filled in, after checking that the model and dataset are known,
    that the dataset holds what the model consumes, and that every option and value is accepted."""
    try:
        spec, data = MODELS.get(model), DATASETS.get(dataset)
    except KeyError as exc:
        raise DdlbenchError(exc.args[0]) from None
    if data.input_kind != spec.input_kind:
        fitting = [name for name in DATASETS.names() if DATASETS.get(name).input_kind == spec.input_kind]
        raise DdlbenchError(
            f"dataset {dataset!r} holds {data.input_kind} inputs but {model} takes {spec.input_kind}; "
            f"datasets for {model}: {', '.join(fitting)}"
        )
    resolved = spec.default_options()
    for option, value in (options or {}).items():
        if option not in spec.options:
            raise DdlbenchError(
                f"{option!r} is not an option of {model}; accepted: {', '.join(spec.options) or 'none'}"
            )
        if value not in spec.options[option]:
            raise DdlbenchError(
                f"option {option}={value!r} is not accepted by {model}; choose from: {', '.join(spec.options[option])}"
            )
        resolved[option] = value
    return tuple(sorted(resolved.items()))
