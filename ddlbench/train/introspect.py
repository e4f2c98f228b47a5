"""Builds a zoo model's model table (ddlbench.catalog.model_table) by probing it on the meta device.

The model is built as the kernel builds it, but on the meta device (shapes only: no memory, no arithmetic,
so GPT-2 large takes seconds), and one training step's forward and backward is run at two batch sizes.
Every figure is attributed to the module running when it arises:

- in forward, the innermost module whose forward is on the stack (forward pre/post hooks);
- in backward, the module whose forward created the autograd node being executed: each module call
  claims the autograd sequence numbers its forward used (innermost first), and a node's backward keeps
  its forward's sequence number. FlopCounterMode's own module tracker is not used for this: it charges
  backward FLOPs to whichever module's gradient hook fired last (the attention's k and v projections
  get the whole attention backward, a residual's Identity the next convolution's).

FLOPs are FlopCounterMode's (its op registry and decompositions); only the attribution is ours. Saved
bytes are the storages autograd's saved-tensor hooks see, each counted once (by its StorageImpl, which
views share; meta storages have no data pointers), parameters and buffers left out. Two batch sizes
tell per-sample figures from fixed ones: per sample = (f(4) − f(2)) / 2, fixed = f(2) − 2 · per sample.
Batch 1 is avoided because batch norm refuses one value per channel in training mode.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count, flop_registry, sdpa_flop_count

from ddlbench.catalog import DATASETS, MODELS, resolve_builder
from ddlbench.catalog.model_table import BlockRow, LayerRow, ModelTable, Shape, resolve_request

log = logging.getLogger(__name__)

PROBE_BATCHES = (2, 4)

aten = torch.ops.aten


def build_meta_model(model: str, dataset: str, options: Mapping[str, str] | None = None) -> nn.Module:
    """The model as the kernel builds it for the dataset, on the meta device (options checked, defaults filled)."""
    resolved = dict(resolve_request(model, dataset, options))
    spec, data = MODELS.get(model), DATASETS.get(dataset)
    with torch.device("meta"):
        return resolve_builder(spec.builder)(
            sample_shape=data.sample_shape, num_outputs=data.num_outputs, **resolved, **dict(spec.shape)
        )


def sample_batch(dataset: str, batch: int, device: str | torch.device = "meta") -> Tensor:
    """A batch of zero inputs of the dataset's shape: int64 token ids (N×T) or fp32 images and volumes."""
    data = DATASETS.get(dataset)
    dtype = torch.long if data.input_kind == "tokens" else torch.float32
    return torch.zeros((batch, *data.sample_shape), dtype=dtype, device=device)


def build_model_table(model: str, dataset: str, options: Mapping[str, str] | None = None) -> ModelTable:
    """The per-layer and per-block table of `model` built for `dataset`, per sample (see the module doc)."""
    resolved = resolve_request(model, dataset, options)
    net = build_meta_model(model, dataset, dict(resolved))
    net.train()
    small, large = (_Probe(net).run(sample_batch(dataset, batch)) for batch in PROBE_BATCHES)
    layers = _layer_rows(net, small, large)
    blocks = _block_rows(net, layers, small, large)
    return ModelTable(
        model=model,
        dataset=dataset,
        options=resolved,
        sample_shape=DATASETS.get(dataset).sample_shape,
        layers=tuple(layers),
        blocks=tuple(blocks),
        torch_version=torch.__version__.split("+")[0],
    )


@dataclass(kw_only=True)
class _Pass:
    """What one forward and backward at one batch size attributed to each module, by module path."""

    batch: int
    forward: Counter[str] = field(default_factory=Counter)  # FLOPs
    backward: Counter[str] = field(default_factory=Counter)  # FLOPs
    saved: Counter[str] = field(default_factory=Counter)  # bytes of storages first saved there
    calls: Counter[str] = field(default_factory=Counter)
    inputs: dict[str, tuple[Shape, int]] = field(default_factory=dict)  # first call: shape, element bytes
    outputs: dict[str, tuple[Shape, int]] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)  # first activity: leaves when called, others when they count


class _AttributedFlopCounter(FlopCounterMode):
    """FlopCounterMode whose counts go to one module each, the one `owner()` names (see the module doc).

    Overrides the private `_count_flops`, where FlopCounterMode hands a counted op to its module stack; should
    a torch release move it, the zoo test (tests/test_model_table.py: every layer's FLOPs add up to
    FlopCounterMode's own total) fails rather than the table going quietly wrong."""

    def __init__(self, owner: Callable[[], str]) -> None:
        super().__init__(display=False)
        # the fused CPU attention (see _FusedAttention), which FlopCounterMode leaves at 0 (no formula, no
        # decomposition), counted as the math path is on meta: its two T×T products forward, their four back
        # (not CUDA flash's count, 2.5× forward with the recomputed scores: model FLOPs, not kernel FLOPs)
        self.flop_registry[aten._scaled_dot_product_flash_attention_for_cpu] = _attention_flops
        self.flop_registry[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _attention_backward_flops
        self.flop_registry[aten.convolution_backward] = grouped_conv_backward_flops
        self.owner = owner
        self.by_module: Counter[str] = Counter()

    def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        if func_packet in self.flop_registry:
            self.by_module[self.owner()] += int(self.flop_registry[func_packet](*args, **kwargs, out_val=out))
        return out


def grouped_conv_backward_flops(
    grad_out: Tensor,
    x: Tensor,
    w: Tensor,
    bias: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    output_mask: Any,
    *,
    out_val: Any = None,
    **kwargs: Any,
) -> int:
    """A convolution's backward FLOPs, groups counted. torch's formula (flop_counter.conv_backward_flop, torch
    2.13) leaves groups out of the input gradient: a depthwise 3×3 over C channels was charged C + 1 times its
    forward (mobilenet_v2's first one, C = 32: 33×). Each gradient of a grouped convolution is as many
    multiply-adds as its forward: the input's (a transposed convolution by the same weights, group by group)
    and the weights' (each weight meets every output position of its group once). Ungrouped convolutions keep
    torch's count."""
    if groups == 1:
        return flop_registry[aten.convolution_backward](  # torch's own formula
            grad_out, x, w, bias, stride, padding, dilation, transposed, output_padding, groups, output_mask,
            out_val=out_val, **kwargs,
        )  # fmt: skip
    forward = conv_flop_count(list(x.shape), list(w.shape), list(grad_out.shape), transposed=transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _attention_flops(query: Tensor, key: Tensor, value: Tensor, *args: Any, out_val: Any = None, **kwargs: Any) -> int:
    return sdpa_flop_count(query.shape, key.shape, value.shape)


def _attention_backward_flops(
    grad: Tensor, query: Tensor, key: Tensor, value: Tensor, *args: Any, **kwargs: Any
) -> int:
    return 2 * sdpa_flop_count(query.shape, key.shape, value.shape)


class _FusedAttention(TorchFunctionMode):
    """Runs F.scaled_dot_product_attention on meta tensors as the fused kernel it is on CPU and GPU.

    Meta tensors fall back to the math path, which keeps the T×T attention weights of every head for
    backward; the CPU and CUDA kernels keep q, k, v, the output and the log-sum-exp (FlashAttention,
    Dao et al. 2022), which is what a real step holds. Same FLOPs: two T×T matrix products forward, four back.
    """

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and args and args[0].is_meta and _fusable(*args, **kwargs):
            query, key, value = args[:3]
            is_causal, scale = kwargs.get("is_causal", False), kwargs.get("scale")
            return aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal, scale=scale)[0]
        return func(*args, **kwargs)


def _fusable(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> bool:
    return attn_mask is None and dropout_p == 0.0 and not enable_gqa and query.shape[-3] == key.shape[-3]


class _Probe:
    """One training step of a meta model at one batch size, with every FLOP and saved byte attributed."""

    def __init__(self, net: nn.Module) -> None:
        self.net = net
        self.leaves = {name for name, module in net.named_modules() if next(module.children(), None) is None}
        self.stack: list[tuple[str, int]] = []  # (module path, first autograd sequence number of the call)
        self.node_owner: dict[int, str] = {}  # autograd sequence number -> module path
        self.backward = False
        # parameters and buffers are not activations, even where autograd saves them (a weight for its input's gradient)
        self.excluded = {_storage_key(t) for t in (*net.parameters(), *net.buffers())}
        self.seen: set[int] = set()
        self.kept: list[Tensor] = []  # saved tensors stay referenced, so no StorageImpl address is reused
        self.result = _Pass(batch=0)

    def run(self, sample: Tensor) -> _Pass:
        self.result = _Pass(batch=sample.shape[0])
        handles = []
        for name, module in self.net.named_modules():
            handles.append(module.register_forward_pre_hook(self._enter(name)))
            handles.append(module.register_forward_hook(self._leave(name)))
        counter = _AttributedFlopCounter(self.owner)
        try:
            with counter, torch.enable_grad(), _FusedAttention():
                with torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack):
                    out = self.net(sample)
                self.result.forward, counter.by_module = counter.by_module, Counter()
                self.backward = True
                out.sum().backward()
                self.result.backward = counter.by_module
        finally:
            for handle in handles:
                handle.remove()
            self.net.zero_grad(set_to_none=True)
        return self.result

    def owner(self) -> str:
        if self.backward:
            node = torch._C._current_autograd_node()
            return self.node_owner.get(node._sequence_nr(), "") if node is not None else ""
        name = self.stack[-1][0] if self.stack else ""
        self.result.order.setdefault(name, len(self.result.order))
        return name

    def _enter(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple) -> None:
            self.stack.append((name, torch._C._autograd._get_sequence_nr()))
            self.result.calls[name] += 1
            if name in self.leaves:
                self.result.order.setdefault(name, len(self.result.order))
            self.result.inputs.setdefault(name, _describe(args[0] if args else None))

        return hook

    def _leave(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            _, start = self.stack.pop()
            # inner modules' hooks ran first and claimed their nodes; the rest are this module's own
            for sequence_nr in range(start, torch._C._autograd._get_sequence_nr()):
                self.node_owner.setdefault(sequence_nr, name)
            self.result.outputs.setdefault(name, _describe(output))

        return hook

    def _pack(self, tensor: Tensor) -> Tensor:
        key = _storage_key(tensor)
        if key not in self.excluded and key not in self.seen:
            self.seen.add(key)
            self.kept.append(tensor)
            self.result.saved[self.owner()] += tensor.untyped_storage().nbytes()
        return tensor


def _unpack(tensor: Tensor) -> Tensor:
    return tensor


def _storage_key(tensor: Tensor) -> int:
    """The StorageImpl's address: shared by views, distinct for live storages, defined on the meta device."""
    return tensor.untyped_storage()._cdata


def _describe(value: Any) -> tuple[Shape, int]:
    if isinstance(value, (tuple, list)):
        value = next((v for v in value if isinstance(v, Tensor)), None)
    return (tuple(value.shape), value.element_size()) if isinstance(value, Tensor) else ((), 0)


def _per_sample(small: _Pass, large: _Pass, small_value: int, large_value: int) -> tuple[int, int]:
    """(per sample, fixed) of a figure measured at the two batch sizes."""
    per_sample = (large_value - small_value) // (large.batch - small.batch)
    return per_sample, small_value - small.batch * per_sample


def _sample_shape(small: _Pass, large: _Pass, shape_small: Shape, shape_large: Shape) -> Shape:
    """One sample's shape: the batch dimension dropped where it grew with the batch; a batch-independent
    tensor (GPT's position ids) as it is."""
    if shape_small and shape_large and (shape_small[0], shape_large[0]) == (small.batch, large.batch):
        return shape_small[1:]
    return shape_small


def _kernel_size(module: nn.Module, input_shape: Shape, output_shape: Shape) -> Shape:
    kind = type(module).__name__
    if "Pool" not in kind or len(input_shape) < 2:
        return ()
    if kind.startswith("Adaptive"):  # the window of a non-overlapping pool with that output
        return tuple(i // max(o, 1) for i, o in zip(input_shape[1:], output_shape[1:], strict=True))
    size = module.kernel_size
    return tuple(size) if isinstance(size, (tuple, list)) else (size,) * (len(input_shape) - 1)


def _layer_rows(net: nn.Module, small: _Pass, large: _Pass) -> list[LayerRow]:
    modules = dict(net.named_modules())
    own_params: dict[str, list[nn.Parameter]] = {}
    counted: set[int] = set()  # a shared parameter belongs to the first module that holds it
    for name, module in modules.items():
        own_params[name] = [p for p in module.parameters(recurse=False) if id(p) not in counted]
        counted.update(id(p) for p in own_params[name])
    leaves = {name for name, module in modules.items() if next(module.children(), None) is None}

    def active(name: str) -> bool:
        figures = (p.forward[name] or p.backward[name] or p.saved[name] for p in (small, large))
        return name in leaves or bool(own_params[name]) or any(figures)

    if active(""):
        raise RuntimeError("the model's root does work of its own; the table has no block for it")
    # in the order they first ran, then any leaf or parameter holder that never ran
    names = sorted((n for n in small.order if n and active(n)), key=small.order.__getitem__)
    names += [n for n in modules if n and n not in small.order and active(n)]
    rows = []
    for name in names:
        module = modules[name]
        forward, fixed_forward = _per_sample(small, large, small.forward[name], large.forward[name])
        backward, fixed_backward = _per_sample(small, large, small.backward[name], large.backward[name])
        saved, saved_fixed = _per_sample(small, large, small.saved[name], large.saved[name])
        if fixed_forward or fixed_backward:
            log.warning(
                "%s: %d + %d FLOPs do not grow with the batch; the table holds per-sample FLOPs only",
                name,
                fixed_forward,
                fixed_backward,
            )
        in_small, in_large = small.inputs.get(name, ((), 0))[0], large.inputs.get(name, ((), 0))[0]
        out_small, out_large = small.outputs.get(name, ((), 0))[0], large.outputs.get(name, ((), 0))[0]
        input_shape = _sample_shape(small, large, in_small, in_large)
        output_shape = _sample_shape(small, large, out_small, out_large)
        leaf = name in leaves
        weight = getattr(module, "weight", None) if leaf else None
        rows.append(
            LayerRow(
                name=name,
                type=type(module).__name__,
                block=int(name.split(".")[0]),
                input_shape=input_shape,
                output_shape=output_shape,
                weight_shape=tuple(weight.shape) if isinstance(weight, Tensor) else (),
                params=sum(p.numel() for p in own_params[name]),
                forward_flops=forward,
                backward_flops=backward,
                saved_bytes=saved,
                saved_fixed_bytes=saved_fixed,
                kernel_size=_kernel_size(module, input_shape, output_shape) if leaf else (),
                calls=small.calls[name],
                leaf=leaf,
                head_features=int(getattr(module, "head_dim", 0) or 0),
            )
        )
    return rows


def _block_rows(net: nn.Module, layers: list[LayerRow], small: _Pass, large: _Pass) -> list[BlockRow]:
    blocks = []
    for index, child in enumerate(net.children()):
        mine = [layer for layer in layers if layer.block == index]
        name = str(index)
        output, dtype_bytes = small.outputs[name]
        blocks.append(
            BlockRow(
                index=index,
                input_shape=_sample_shape(small, large, small.inputs[name][0], large.inputs[name][0]),
                output_shape=_sample_shape(small, large, output, large.outputs[name][0]),
                output_dtype_bytes=dtype_bytes,
                params=sum(layer.params for layer in mine),
                param_bytes=sum(p.numel() * p.element_size() for p in child.parameters()),
                buffer_bytes=sum(b.numel() * b.element_size() for b in child.buffers()),
                forward_flops=sum(layer.forward_flops for layer in mine),
                backward_flops=sum(layer.backward_flops for layer in mine),
                saved_bytes=sum(layer.saved_bytes for layer in mine),
                saved_fixed_bytes=sum(layer.saved_fixed_bytes for layer in mine),
            )
        )
    return blocks
