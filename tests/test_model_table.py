"""The model table: every parameter and FLOP of the zoo accounted for layer by layer, saved activations as a
real CPU step keeps them, the `model-table` command, and ParaDL's `.net` layer format."""

from __future__ import annotations

import csv
import functools
import io
import json
import subprocess
import sys
from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from ddlbench.analysis.analytic.layers import parse_net, parse_net_header, render_net
from ddlbench.analysis.analytic.table_cache import find_table
from ddlbench.catalog import DATASETS, MODELS, resolve_builder
from ddlbench.catalog.model_table import ModelTable
from ddlbench.cli import main
from ddlbench.train.introspect import build_model_table, grouped_conv_backward_flops

SECOND_DATASETS = {"mnist", "highres", "tinyimagenet", "stl10", "imagenette", "webface112"}
# Every model on the datasets that change its layers' shapes; within CI's time budget the extra image sizes
# (mnist's one channel, highres, tinyimagenet, stl10, imagenette, webface112) run with one model, and the largest
# models on their reference dataset only
PAIRS = [
    (model, dataset)
    for model in MODELS.names()
    for dataset in DATASETS.names()
    if MODELS.get(model).input_kind == DATASETS.get(dataset).input_kind
    and (dataset not in SECOND_DATASETS or model == "resnet18")
    and (model not in {"resnet152", "gpt_small", "gpt_medium", "gpt_large"} or dataset in {"imagenet", "tokens"})
]
# The quick set keeps each model once or twice: the image models on cifar10 (small stem) and imagenet (large
# stem), except those whose table takes seconds on a 2-core machine (module count, not input size, sets the
# meta probe's cost), which run on one dataset, or only with the slow tests (same code as a smaller sibling).
SLOW_MODELS = {
    "resnet101",
    "resnet152",
    "wide_resnet50_2",
    "wide_resnet101_2",
    "vgg19",
    "gpt_small",
    "gpt_medium",
    "gpt_large",
}
ONE_QUICK_DATASET = {"mobilenet_v2": "cifar10", "resnet50": "imagenet"}


def _marked(model: str, dataset: str):
    slow = model in SLOW_MODELS or dataset in SECOND_DATASETS or ONE_QUICK_DATASET.get(model, dataset) != dataset
    return pytest.param(model, dataset, marks=pytest.mark.slow if slow else (), id=f"{model}-{dataset}")


@functools.cache
def table_of(model: str, dataset: str, options: tuple[tuple[str, str], ...] = ()) -> ModelTable:
    """At the model's default options, the table the package ships (find_table): tests/test_login_no_torch.py
    checks that each shipped table is what build_model_table makes now, so these tests check the builder's
    tables without building each one a second time; other options are built."""
    return find_table(model, dataset) if not options else build_model_table(model, dataset, dict(options))


def build(model: str, dataset: str, device: str, **options: str) -> nn.Module:
    """The model as its builder makes it, with the catalog's defaults (independently of the introspection)."""
    spec, data = MODELS.get(model), DATASETS.get(dataset)
    torch.manual_seed(0)
    with torch.device(device):
        return resolve_builder(spec.builder)(
            sample_shape=data.sample_shape,
            num_outputs=data.num_outputs,
            **(spec.default_options() | options),
            **dict(spec.shape),
        )


def inputs(dataset: str, batch: int, device: str) -> torch.Tensor:
    data = DATASETS.get(dataset)
    if data.input_kind == "tokens":
        return torch.randint(0, data.num_outputs, (batch, *data.sample_shape), device=device)
    return torch.randn((batch, *data.sample_shape), device=device)


@pytest.mark.parametrize(("model", "dataset"), [_marked(*pair) for pair in PAIRS])
def test_table_accounts_for_the_whole_model(model, dataset):
    table = table_of(model, dataset)
    net = build(model, dataset, "meta")
    net.eval()  # batch norm takes one sample on 1×1 maps in eval mode; FLOPs are the same in training mode
    counter = FlopCounterMode(display=False)  # torch's formulas, with the table's count of grouped convolutions
    counter.flop_registry[torch.ops.aten.convolution_backward] = grouped_conv_backward_flops
    with counter:
        out = net(inputs(dataset, 1, "meta"))
        forward = counter.get_total_flops()
        out.sum().backward()
    backward = counter.get_total_flops() - forward

    assert sum(layer.params for layer in table.layers) == sum(p.numel() for p in net.parameters())
    assert sum(layer.forward_flops for layer in table.layers) == forward
    assert sum(layer.backward_flops for layer in table.layers) == backward
    assert table.param_bytes == 4 * table.params  # fp32

    assert len(table.blocks) == MODELS.get(model).blocks == len(list(net.children()))
    assert table.blocks[0].input_shape == DATASETS.get(dataset).sample_shape
    assert table.blocks[-1].output_shape == tuple(out.shape[1:])
    for before, after in zip(table.blocks, table.blocks[1:], strict=False):
        assert before.output_shape == after.input_shape, (before.index, after.index)
    assert [layer.block for layer in table.layers] == sorted(layer.block for layer in table.layers)
    for block in table.blocks:
        mine = [layer for layer in table.layers if layer.block == block.index]
        for figure in ("params", "forward_flops", "backward_flops", "saved_bytes", "saved_fixed_bytes"):
            assert getattr(block, figure) == sum(getattr(layer, figure) for layer in mine), (block.index, figure)
    assert ModelTable.from_json(json.loads(json.dumps(table.to_json()))) == table


@pytest.mark.parametrize("groups", [1, 4, 32])
def test_a_convolutions_backward_counts_each_gradient_as_its_forward_whatever_its_groups(groups):
    """Counted on a real CPU convolution, against its own forward count: the input's gradient and the weights'
    each as many FLOPs as the forward (torch's own formula gives a depthwise one 33x its forward), one of them
    where the input needs no gradient (a model's first layer)."""
    conv = nn.Conv2d(32, 32, 3, padding=1, groups=groups)
    for needs_input_grad, gradients in ((True, 2), (False, 1)):
        x = torch.randn(2, 32, 8, 8, requires_grad=needs_input_grad)
        counter = FlopCounterMode(display=False)
        counter.flop_registry[torch.ops.aten.convolution_backward] = grouped_conv_backward_flops
        with counter:
            out = conv(x)
            forward = counter.get_total_flops()
            out.sum().backward()
        assert forward == 2 * 2 * 8 * 8 * 32 * (32 // groups) * 9  # 2 FLOPs per multiply-add, per sample
        assert counter.get_total_flops() - forward == gradients * forward, (groups, needs_input_grad)


def test_mobilenets_depthwise_layers_count_two_forwards_backward():
    table = table_of("mobilenet_v2", "cifar10")
    depthwise = [layer for layer in table.layers if layer.type == "Conv2d" and layer.weight_shape[1] == 1]
    assert len(depthwise) >= 10
    for layer in depthwise:
        assert layer.backward_flops == 2 * layer.forward_flops, layer.name


@pytest.mark.parametrize(("model", "dataset"), [("resnet8", "cifar10"), ("gpt_tiny", "tokens_small")])
def test_backward_flops_land_on_the_layer_that_ran_forward(model, dataset):
    """FlopCounterMode's own module tracker charges a layer's backward to its neighbours; ours must not."""
    layers = table_of(model, dataset).layers
    counted = [layer for layer in layers if layer.forward_flops]
    assert counted[0].type in ("Conv2d", "Linear") or not counted[0].leaf
    first_conv = next((layer for layer in counted if layer.type == "Conv2d"), None)
    for layer in counted:
        # the input's gradient and the weight's cost a forward each; the images need no gradient
        expected = layer.forward_flops if layer is first_conv and layer.block == 0 else 2 * layer.forward_flops
        assert layer.backward_flops == expected, layer.name
    assert all(layer.backward_flops == 0 for layer in layers if not layer.forward_flops)


def measured_saved_bytes(model: str, dataset: str, batch: int, **options: str) -> int:
    """Bytes a real CPU forward keeps for backward: storages seen by the saved-tensor hooks, by address,
    parameters and buffers left out."""
    net = build(model, dataset, "cpu", **options)
    excluded = {t.untyped_storage().data_ptr() for t in (*net.parameters(), *net.buffers())}
    sizes: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            sizes[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = net(inputs(dataset, batch, "cpu"))
    assert out.grad_fn is not None  # the graph, and with it every saved storage, is alive while we count
    return sum(sizes.values())


@pytest.mark.parametrize(
    ("model", "dataset", "options"),
    [("resnet8", "cifar10", ()), ("resnet8", "cifar10", (("norm", "group"),)), ("gpt_tiny", "tokens_small", ())],
)
def test_saved_bytes_match_a_real_cpu_step_at_every_batch_size(model, dataset, options):
    table = table_of(model, dataset, options)
    assert table.saved_bytes > 0
    for batch in (1, 3):
        assert measured_saved_bytes(model, dataset, batch, **dict(options)) == (
            batch * table.saved_bytes + table.saved_fixed_bytes
        ), batch


def test_csv_params_add_up_to_the_model(tmp_path):
    out = tmp_path / "resnet8.csv"
    assert main(["-q", "model-table", "resnet8", "cifar10", "--format", "csv", "--out", str(out)]) == 0
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert sum(int(row["params"]) for row in rows) == sum(
        p.numel() for p in build("resnet8", "cifar10", "meta").parameters()
    )
    assert rows[0]["input_shape"] == "3x32x32"
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary file left behind


def test_net_output_has_a_line_per_layer_of_each_kind(tmp_path, capsys):
    assert main(["-q", "model-table", "resnet8", "cifar10", "--format", "net"]) == 0
    text = capsys.readouterr().out
    assert parse_net_header(text) == {"Dataset": "cifar10", "Input": "1x3x32x32", "Model": "resnet8"}
    layers = parse_net(text)
    kinds = Counter(layer.kind for layer in layers)
    modules = Counter(type(m) for m in build("resnet8", "cifar10", "meta").modules())
    expected = {
        "CONV": modules[nn.Conv2d],
        "BNORM": modules[nn.BatchNorm2d],
        "RELU": modules[nn.ReLU],
        "FC": modules[nn.Linear],
        "APOOL": modules[nn.AdaptiveAvgPool2d],
    }
    assert {kind: kinds[kind] for kind in expected} == expected
    assert all(layer.name.startswith(layer.kind + "_") for layer in layers)  # ParaDL reads each as its kind
    assert all(layer.time_s is None for layer in layers)  # no times known: ParaDL estimates them from FLOPs


def test_bad_names_and_options_are_refused_with_the_choices(capsys):
    assert main(["-q", "model-table", "resnet9", "cifar10"]) == 2
    assert "resnet9" in (err := capsys.readouterr().err) and "known models" in err and "resnet8" in err
    assert main(["-q", "model-table", "resnet8", "cifar10", "--option", "norm=nonsense"]) == 2
    assert "norm" in (err := capsys.readouterr().err) and "nonsense" in err and "batch, group" in err
    assert main(["-q", "model-table", "resnet8", "cifar10", "--option", "depth=3"]) == 2
    assert "depth" in (err := capsys.readouterr().err) and "accepted: norm" in err
    assert main(["-q", "model-table", "resnet8", "tokens_small"]) == 2
    err = capsys.readouterr().err
    image_datasets = "cifar10, highres, imagenet, imagenet128, imagenette, mnist, stl10, tinyimagenet, webface112"
    assert "image2d" in err and image_datasets in err
    with pytest.raises(SystemExit):
        main(["-q", "model-table", "resnet8", "cifar10", "--format", "xml"])
    assert "table, csv, net, json" in capsys.readouterr().err.replace("'", "")


def test_help_and_refusals_do_not_import_torch():
    code = (
        "import sys, contextlib, io\n"
        "from ddlbench.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['model-table', '--help'])\n"
        "assert main(['-q', 'model-table', 'nosuch', 'cifar10']) == 2\n"
        "sys.exit(3 if 'torch' in sys.modules else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr or "model-table --help imported torch"
    assert "unknown model 'nosuch'" in result.stderr


# Lines of ParaDL's ResNet-50 layer file: TruongThaoNguyen/paraDL-analysis, model/RESNET50_ImageNet_profall.net_sc
# (its input is 3×226×226, so the stem's outputs are 113 where ours, on 224, are 112).
PARADL_RESNET50 = """\
Dataset|ImageNet
Input|1280000x3x226x226
Model|ResNet50
CONV_1|3x226x226|3x64x7x7|64x113x113|0.003119502
BNORM|64x113x113|64x64x0x0|64x113x113|0
RELU|64x113x113|64x64x0x0|64x113x113|0
MPOOL|64x113x113|0x0x3x3|64x56x56|0
# First block group
CONV_2a1|64x56x56|64x64x1x1|64x56x56|0
BNORM|64x56x56|64x64x0x0|64x56x56|0
CONV_2a3|64x56x56|64x256x1x1|256x56x56|0
#|0
APOOL|2048x7x7|0x0x7x7|2048x1x1|0
FC6|2048x1x1|2048x1000x1x1|1000x1x1|0
"""


def test_paradl_lines_are_read_and_written_in_their_notation():
    theirs = parse_net(PARADL_RESNET50)
    assert [layer.kind for layer in theirs] == [
        "CONV",
        "BNORM",
        "RELU",
        "MPOOL",
        "CONV",
        "BNORM",
        "CONV",
        "APOOL",
        "FC",
    ]
    assert theirs[0] == ("CONV_1", "CONV", (3, 226, 226), (3, 64, 7, 7), (64, 113, 113), 0.003119502)
    assert parse_net_header(PARADL_RESNET50)["Input"] == "1280000x3x226x226"

    table = table_of("resnet50", "imagenet")
    times = {layer.name: 0.5 for layer in table.layers if layer.type == "Conv2d"}
    text = render_net(table, times=times)
    ours = parse_net(text)
    assert len(ours) == len(table.layers)
    assert [line.count("|") for line in text.splitlines()[3:] if not line.startswith("#")] == [4] * len(ours)
    fields = {(layer.kind, layer.x_shape, layer.w_shape, layer.y_shape) for layer in ours}
    for layer in theirs[4:]:  # past the stem, the same layers in the same notation
        assert (layer.kind, layer.x_shape, layer.w_shape, layer.y_shape) in fields, layer.name
    stem = {layer.kind: layer for layer in ours[:4]}
    assert stem["CONV"].w_shape == theirs[0].w_shape and stem["MPOOL"].w_shape == theirs[3].w_shape
    assert stem["BNORM"].w_shape == (64, 64, 0, 0) and stem["CONV"].time_s == 0.5 and stem["BNORM"].time_s == 0
