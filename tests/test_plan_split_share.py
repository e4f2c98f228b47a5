"""The share of FLOPs a ParaDL split really splits: predicted at plan time from the catalog's layer table,
without torch, and reported by every rank as `split_flops_share` from the modules it really swapped.

The prediction must be the ranks' own figure: first against the strategies' plans on the built models
(no ranks, every split size), then against real runs. Points that would split less than the threshold
are skipped at plan time with a reason naming the share and the threshold.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ddlbench.catalog import DATASETS, STRATEGIES
from ddlbench.catalog.layer_table import predict_split_share
from ddlbench.launch.runner import run_point
from ddlbench.train.kernel import build_model
from ddlbench.train.strategies.flops import count_model_flops
from ddlbench.train.strategies.paradl import plan_split
from ddlbench.train.strategies.spatial import plan_region
from ddlbench.validity import MIN_SPLIT_FLOPS_SHARE, why_skipped
from tests.conftest import make_point
from tests.equivalence import layout_point

# (model, dataset, model options): layouts of every kind the zoo has (residual shortcuts, depthwise convs,
# an ImageNet stem with max-pool, VGG's pools, AlexNet's adaptive pool, 3-D volumes, a forced stem)
MODELS_BUILT = [
    ("resnet8", "cifar10", ()),
    ("resnet8", "mnist", ()),
    ("resnet50", "imagenet", ()),
    ("resnet18", "imagenet", (("stem", "cifar"),)),
    ("mobilenet_v2", "cifar10", ()),
    ("vgg11", "imagenet", (("norm", "none"),)),
    ("alexnet", "cifar10", ()),
    ("cosmoflow", "cosmoflow32", ()),
]
PARTS = (2, 3, 4, 8)
SPLIT_KINDS = {"fp": "filter", "cp": "channel", "sp": "spatial"}


@pytest.mark.parametrize(("model", "dataset", "options"), MODELS_BUILT, ids=[f"{m}-{d}" for m, d, _ in MODELS_BUILT])
def test_prediction_is_what_the_strategies_plan_on_the_built_model(model, dataset, options):
    point = make_point(model=model, dataset=dataset, model_options=options)
    with torch.device("meta"):  # shapes only: the plans and the FLOP probe need no numbers
        net = build_model(point)
    sample = torch.zeros((1, *DATASETS.get(dataset).sample_shape), device="meta")
    flops = count_model_flops(net, sample)  # what the ranks compute their fact from
    for parts in PARTS:
        for kind in ("filter", "channel"):
            predicted = predict_split_share(model, dataset, options, kind, parts)
            split = [name for name, reason in plan_split(net, parts, kind).items() if reason is None]
            assert list(predicted.names) == split, (kind, parts)
            assert predicted.flops_share == pytest.approx(flops.share(split), abs=1e-12), (kind, parts)
        predicted = predict_split_share(model, dataset, options, "spatial", parts)
        region = plan_region(net, sample, parts, shapes=flops.shapes)
        assert (predicted.split, predicted.detail) == (region.children, region.reason), parts
        assert list(predicted.names) == [layer.name for layer in region.layers], parts
        assert predicted.flops_share == pytest.approx(flops.share(predicted.names), abs=1e-12), parts


# --------------------------------------------------------------------------------------------- plan time


def test_a_split_that_divides_no_layer_is_skipped_naming_its_share_and_the_threshold():
    reason = why_skipped(layout_point(strategy="filter", nodes=1, ranks_per_node=3))
    assert reason == (
        "filter over 3 ranks splits 0 of the 10 convolution and linear layers of resnet8, 0 % of its forward "
        "FLOPs on cifar10, below the 50 % a point needs to be compared as filter"
    )
    assert MIN_SPLIT_FLOPS_SHARE == 0.5
    assert "0 %" in why_skipped(layout_point(strategy="channel", nodes=1, ranks_per_node=3))


def test_spatial_resnet50_on_imagenet_over_8_ranks_is_skipped_and_over_2_runs():
    skipped = why_skipped(layout_point(strategy="spatial", model="resnet50", dataset="imagenet", ranks_per_node=8))
    assert skipped is not None and "runs 4 of the 18 blocks" in skipped and "19 %" in skipped and "50 %" in skipped
    hybrid = layout_point(strategy="dp_spatial", model="resnet50", dataset="imagenet", ranks_per_node=16, split=8)
    assert "dp_spatial with split=8 runs 4 of the 18 blocks" in why_skipped(hybrid)
    assert why_skipped(layout_point(strategy="spatial", model="resnet50", dataset="imagenet", ranks_per_node=2)) is None


def test_the_hybrids_are_judged_by_their_split_not_their_world():
    # dp_filter on 6 ranks: split 2 divides every layer of resnet8, split 3 none
    fine = layout_point(strategy="dp_filter", nodes=1, ranks_per_node=6, split=2)
    assert why_skipped(fine) is None
    assert "dp_filter with split=3 splits 0 of the 10" in why_skipped(
        layout_point(strategy="dp_filter", nodes=1, ranks_per_node=6, split=3)
    )


def test_every_split_strategy_and_model_of_the_table_is_predicted_without_torch():
    code = (
        "import sys\n"
        "from ddlbench.catalog import DATASETS, MODELS\n"
        "from ddlbench.catalog.layer_table import predict_split_share\n"
        "from ddlbench.validity import why_skipped\n"
        "from ddlbench.point import Point\n"
        "n = 0\n"
        "for model in MODELS.names():\n"
        "    spec = MODELS.get(model)\n"
        "    if spec.family == 'transformer': continue\n"
        "    for dataset in DATASETS.names():\n"
        "        if DATASETS.get(dataset).input_kind != spec.input_kind: continue\n"
        "        for kind in ('filter', 'channel', 'spatial'):\n"
        "            assert 0 <= predict_split_share(model, dataset, (), kind, 2).flops_share <= 1\n"
        "            n += 1\n"
        "point = Point(model='resnet8', dataset='cifar10', strategy='filter', nodes=1, ranks_per_node=3,\n"
        "    batch_size=8, threads=1, repetition=0, warmup_steps=1, steps=1, seed=0, learning_rate=0.1,\n"
        "    timeout_s=60, split=3)\n"
        "assert 'splits 0 of' in why_skipped(point)\n"
        "sys.exit(3 if 'torch' in sys.modules else 0 if n > 50 else 4)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr or f"exit {result.returncode} (3: torch was imported)"


# --------------------------------------------------------------------------------------------- run time

REAL_CASES = [
    # the region ends at stage 3, whose 7 rows do not split in two: 70 % of the FLOPs on slabs
    pytest.param("spatial", "resnet8", "mnist", 2, {}, id="spatial-resnet8-mnist-2"),
    # the stem's 3 input channels do not split: 96 %
    pytest.param("channel", "resnet8", "cifar10", 2, {}, id="channel-resnet8-cifar10-2"),
    # depthwise convolutions stay replicated: 93 %
    pytest.param("filter", "mobilenet_v2", "cifar10", 2, {}, id="filter-mobilenet_v2-cifar10-2"),
    # the hybrid splits over its split, not over its world
    pytest.param("dp_spatial", "resnet8", "mnist", 4, {"split": 2}, id="dp_spatial-resnet8-mnist-4x2"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "model", "dataset", "ranks", "extra"), REAL_CASES)
def test_every_rank_reports_the_share_the_plan_predicted(tmp_path, strategy, model, dataset, ranks, extra):
    point = layout_point(
        strategy=strategy,
        model=model,
        dataset=dataset,
        nodes=1,
        ranks_per_node=ranks,
        batch_size=2,
        warmup_steps=1,
        steps=1,
        model_options=(("norm", "group"),),
        **extra,
    )
    assert why_skipped(point) is None
    kind = SPLIT_KINDS[STRATEGIES.get(strategy).split_dim]
    predicted = predict_split_share(model, dataset, point.model_options, kind, point.split)
    assert MIN_SPLIT_FLOPS_SHARE <= predicted.flops_share < 1  # a case where what stays whole matters
    record = run_point(point, out=tmp_path / "record.json", launcher="local")
    assert record.status == "ok", record.reason
    shares = [rank.facts["split_flops_share"] for rank in record.ranks]
    assert len(shares) == ranks
    assert shares == pytest.approx([predicted.flops_share] * ranks, abs=1e-12)
