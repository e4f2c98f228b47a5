"""The CNN model zoo: every model builds for every dataset it can take, in the shape strategies rely on.

Strategies cut a model between its top-level children (pipelines) or swap its Conv/Linear/Pool/Norm
submodules (spatial, filter, channel), so besides the output shape these tests check the contract:
exactly `spec.blocks` children, each mapping a tensor to a tensor, only plain swappable layers, every
parameter reached by the backward pass, and the same weights from the same seed.

The full grid (model × dataset × norm × stem) runs on the meta device, where shapes propagate and
autograd builds its graph but nothing is computed: VGG-16 at 512² or CosmoFlow at 128³ cost nothing
there. Real arithmetic runs on the small dataset of each input kind, where it is cheap.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddlbench.catalog import DATASETS, MODELS
from ddlbench.train.kernel import build_model
from ddlbench.train.models.resnet import SMALL_INPUT_MAX_SIDE, group_count
from tests.conftest import make_point

BATCH = 2  # the smallest batch BatchNorm accepts on a 1×1 map in training mode
CNNS = [name for name in MODELS.names() if MODELS.get(name).family in ("cnn2d", "cnn3d")]
SMALL_DATASET = {"image2d": "cifar10", "volume3d": "cosmoflow32"}
# The layers a strategy may find and swap; anything else with weights or pooling would escape it.
PLAIN_LEAVES = (
    nn.Conv2d,
    nn.Conv3d,
    nn.Linear,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.GroupNorm,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AdaptiveAvgPool2d,
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.Flatten,
    nn.Identity,
)
# Published parameter counts on ImageNet (3×224², 1000 classes), batch-norm variants where they exist
# (torchvision's model cards).
PUBLISHED_PARAMETERS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "wide_resnet50_2": 68_883_240,
    "wide_resnet101_2": 126_886_696,
    "vgg11": 132_868_840,
    "vgg13": 133_053_736,
    "vgg16": 138_365_992,
    "vgg19": 143_678_248,
    "mobilenet_v2": 3_504_872,
    "alexnet": 61_100_840,
}


def datasets_of(model: str) -> list[str]:
    kind = MODELS.get(model).input_kind
    return [name for name in DATASETS.names() if DATASETS.get(name).input_kind == kind]


def option_grid(model: str, dataset: str) -> list[dict[str, str]]:
    """Every norm at the default stem; every forced stem (where it differs from "auto") at the default norm."""
    spec = MODELS.get(model)
    grid = [{**spec.default_options(), "norm": norm} for norm in spec.options["norm"]]
    if "stem" in spec.options:
        auto = "cifar" if DATASETS.get(dataset).sample_shape[1] <= SMALL_INPUT_MAX_SIDE else "imagenet"
        grid += [
            {**spec.default_options(), "stem": stem} for stem in spec.options["stem"] if stem not in ("auto", auto)
        ]
    return grid


def build(model: str, dataset: str, *, seed: int = 0, device: str = "cpu", **options: str) -> nn.Sequential:
    """The model as a rank builds it (the kernel's build_model), on `device`."""
    point = make_point(model=model, dataset=dataset, seed=seed, model_options=tuple(sorted(options.items())))
    with torch.device(device):
        return build_model(point)


def run_block_by_block(net: nn.Sequential, x: Tensor) -> Tensor:
    for index, child in enumerate(net):
        x = child(x)
        assert isinstance(x, Tensor) and x.shape[0] == BATCH, f"child {index} ({type(child).__name__}) gave {x!r:.80}"
    return x


def case_id(model: str, dataset: str, options: dict[str, str]) -> str:
    return "-".join([model, dataset, *options.values()])


META_CASES = [(m, d, o) for m in CNNS for d in datasets_of(m) for o in option_grid(m, d)]


@pytest.mark.parametrize(("model", "dataset", "options"), META_CASES, ids=[case_id(*c) for c in META_CASES])
def test_every_combination_runs_block_by_block_and_reaches_every_parameter(model, dataset, options):
    spec, data = MODELS.get(model), DATASETS.get(dataset)
    net = build(model, dataset, device="meta", **options)
    assert len(net) == spec.blocks

    called: set[nn.Module] = set()
    leaves = [module for module in net.modules() if not list(module.children())]
    for leaf in leaves:
        leaf.register_forward_hook(lambda module, args, out: called.add(module))
    out = run_block_by_block(net, torch.empty(BATCH, *data.sample_shape, device="meta"))
    assert out.shape == (BATCH, data.num_outputs)
    # every layer is a module the forward pass calls: none is bypassed by a functional call
    assert [type(leaf).__name__ for leaf in leaves if leaf not in called] == []

    out.sum().backward()
    assert [name for name, p in net.named_parameters() if p.grad is None or p.grad.shape != p.shape] == []


# every norm, default stem: the stems only change shapes, which the meta grid covers
REAL_CASES = [
    (m, SMALL_DATASET[MODELS.get(m).input_kind], {"norm": norm}) for m in CNNS for norm in MODELS.get(m).options["norm"]
]


@pytest.mark.parametrize(("model", "dataset", "options"), REAL_CASES, ids=[case_id(*c) for c in REAL_CASES])
def test_one_real_backward_pass_gives_finite_outputs_and_a_gradient_on_every_parameter(model, dataset, options):
    data = DATASETS.get(dataset)
    torch.manual_seed(1)
    x = torch.randn(BATCH, *data.sample_shape)
    net = build(model, dataset, **options)
    out = run_block_by_block(net, x)
    assert out.shape == (BATCH, data.num_outputs) and torch.isfinite(out).all()
    if data.task == "classify":
        loss = F.cross_entropy(out, torch.arange(BATCH) % data.num_outputs)
    else:
        loss = F.mse_loss(out, torch.zeros_like(out))
    loss.backward()
    # a parameter whose gradient is exactly zero does not influence the loss: a wiring mistake
    bad = [
        n for n, p in net.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all() or not p.grad.any()
    ]
    assert bad == []


@pytest.mark.parametrize("model", CNNS)
def test_same_seed_gives_the_same_weights_and_another_seed_other_weights(model):
    dataset = SMALL_DATASET[MODELS.get(model).input_kind]
    a, b, c = (build(model, dataset, seed=seed).state_dict() for seed in (0, 0, 1))
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert not all(torch.equal(a[key], c[key]) for key in a)


@pytest.mark.parametrize("model", CNNS)
def test_layers_are_plain_swappable_modules_without_in_place_activations(model):
    net = build(model, SMALL_DATASET[MODELS.get(model).input_kind], device="meta")
    leaves = [module for module in net.modules() if not list(module.children())]
    assert [type(leaf).__name__ for leaf in leaves if not isinstance(leaf, PLAIN_LEAVES)] == []
    assert [type(leaf).__name__ for leaf in leaves if getattr(leaf, "inplace", False)] == []


@pytest.mark.parametrize("model", sorted(PUBLISHED_PARAMETERS))
def test_imagenet_parameter_counts_match_the_published_ones_within_one_percent(model):
    norm = "batch" if "batch" in MODELS.get(model).options["norm"] else "none"
    net = build(model, "imagenet", device="meta", norm=norm)
    assert sum(p.numel() for p in net.parameters()) == pytest.approx(PUBLISHED_PARAMETERS[model], rel=0.01)


@pytest.mark.parametrize("model", CNNS)
def test_the_catalogs_parameter_text_agrees_with_the_built_model(model):
    """'11.7M' means 11.65M–11.75M: within half a unit of the text's last digit, at the default options."""
    spec = MODELS.get(model)
    dataset = {
        "image2d": "cifar10" if spec.builder.startswith("ddlbench.train.models.cifar_resnet:") else "imagenet",
        "volume3d": "cosmoflow",
    }[spec.input_kind]
    match = re.fullmatch(r"~?(\d+)(?:\.(\d+))?([kM])", spec.parameters)
    assert match, f"unparseable parameter text {spec.parameters!r}"
    whole, decimals, unit = match.groups()
    scale = {"k": 1e3, "M": 1e6}[unit]
    stated = float(f"{whole}.{decimals or 0}") * scale
    half_unit = 0.5 * scale / 10 ** len(decimals or "")
    net = build(model, dataset, device="meta", **spec.default_options())
    assert abs(sum(p.numel() for p in net.parameters()) - stated) <= half_unit


def test_group_norm_groups_divide_every_channel_count_and_are_32_where_possible():
    for channels in range(1, 2049):
        groups = group_count(channels)
        assert channels % groups == 0 and groups <= 32
        assert not any(channels % larger == 0 for larger in range(groups + 1, 33))


@pytest.mark.parametrize("model", ["resnet18", "resnet50", "resnet152"])
def test_resnet_stem_is_the_cifar_one_up_to_64_pixels_unless_forced(model):
    def stem_kernel(dataset: str, **options: str) -> tuple[int, ...]:
        return build(model, dataset, device="meta", **options)[0][0].kernel_size

    assert stem_kernel("cifar10") == (3, 3) and stem_kernel("imagenet") == (7, 7)
    assert stem_kernel("cifar10", stem="imagenet") == (7, 7) and stem_kernel("highres", stem="cifar") == (3, 3)


def test_vgg_and_alexnet_switch_to_their_imagenet_layout_only_above_64_pixels():
    for model in ("vgg11", "vgg16"):
        widths = {d: build(model, d, device="meta")[-2][0].out_features for d in ("mnist", "cifar10", "imagenet")}
        assert widths == {"mnist": 512, "cifar10": 512, "imagenet": 4096}
    assert build("alexnet", "cifar10", device="meta")[0][0].kernel_size == (3, 3)
    assert build("alexnet", "imagenet", device="meta")[0][0].kernel_size == (11, 11)


@pytest.mark.parametrize("dataset", ["cifar10", "imagenet", "highres"])
def test_pools_use_ceil_mode_only_on_odd_sides(dataset):
    """Spatial strategies split floor-mode pools only; every pool on these even-sided datasets must be one."""
    for model in [m for m in CNNS if MODELS.get(m).input_kind == "image2d"]:
        pools = [m for m in build(model, dataset, device="meta").modules() if isinstance(m, nn.MaxPool2d)]
        assert [p for p in pools if p.ceil_mode] == [], model
    # MNIST reaches a 7×7 map, which a 2×2 pool must not shrink to 3×3 (the tiny-map case)
    assert any(m.ceil_mode for m in build("vgg11", "mnist", device="meta").modules() if isinstance(m, nn.MaxPool2d))


@pytest.mark.parametrize(
    ("model", "options", "message"),
    [
        ("resnet50", {"norm": "none"}, "accepted: batch, group"),
        ("resnet18", {"stem": "tiny"}, "accepted: auto, imagenet, cifar"),
        ("vgg16", {"norm": "layer"}, "accepted: batch, group, none"),
        ("cosmoflow", {"norm": "instance"}, "accepted: batch, group, none"),
    ],
)
def test_unknown_options_are_refused_with_the_accepted_values(model, options, message):
    dataset = SMALL_DATASET[MODELS.get(model).input_kind]
    with pytest.raises(ValueError, match=message):
        build(model, dataset, device="meta", **options)
