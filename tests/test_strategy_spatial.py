"""ParaDL spatial parallelism and its dp × sp hybrid: the halo-row arithmetic as pure functions, then real
ranks (local launcher, gloo) against one process training on the same global batches."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from torch import nn

from ddlbench.train.models.cifar_resnet import build_resnet8
from ddlbench.train.strategies.halo import Piece, SlabWindowed, geometry, halo_windows, output_extent, rank_plan
from ddlbench.train.strategies.spatial import plan_region
from tests.float64 import check_against_reference_float64

# Each output row is computed from the same inputs and weights as in one process, but the slab-shaped
# convolutions may pick other kernels, the norm statistics are combined from per-slab moments, and each
# weight gradient is the sum of two ranks' partial sums: rounding, within the bound of
# tests/equivalence.py where training is smooth. But the slabs round a sample's forward otherwise than one
# process does, and where a ReLU input sits within a rounding of its gate that flips it on some CPU and
# not another (tests/chaos.py finds such fixtures): so the trainings are compared in float64
# (tests/float64.py), measured within 1/40 of the float64 bound. A missing or misplaced halo row moves
# boundary outputs by > 1e-2 (the negative test below) and a statistic's gradient not shared moves
# parameters by 5e-3 (tried by hand): millions of float64 bounds.


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _cases() -> list[tuple[str, nn.Module, int, int]]:
    """(label, layer, extent along dim 2, parts): the zoo's layer shapes plus wide/dilated kernels whose
    windows reach past the neighbouring slab."""
    return [
        ("conv3x3", nn.Conv2d(2, 3, 3, padding=1), 32, 2),
        ("conv3x3 on 4", nn.Conv2d(2, 3, 3, padding=1), 32, 4),
        ("conv3x3 stride 2", nn.Conv2d(2, 3, 3, stride=2, padding=1), 32, 4),
        ("shortcut 1x1 stride 2", nn.Conv2d(2, 3, 1, stride=2), 16, 2),
        ("imagenet stem 7x7 stride 2", nn.Conv2d(2, 3, 7, stride=2, padding=3), 32, 2),
        ("stem max-pool 3x3 stride 2", nn.MaxPool2d(3, stride=2, padding=1), 16, 2),
        ("vgg max-pool 2x2", nn.MaxPool2d(2), 32, 4),
        ("avg-pool 3x3", nn.AvgPool2d(3, stride=1, padding=1), 8, 4),
        ("dilated 5x5 past the neighbour", nn.Conv2d(2, 3, 5, padding=4, dilation=2), 8, 4),
        ("unpadded 5x5", nn.Conv2d(2, 3, 5, padding=(0, 2)), 12, 4),
        ("conv3d", nn.Conv3d(2, 3, 3, padding=1), 8, 2),
        ("max-pool3d", nn.MaxPool3d(2), 8, 2),
    ]


def _slab_outputs(layer: nn.Module, x: torch.Tensor, parts: int, *, drop_halo: bool = False) -> list[torch.Tensor]:
    """Each rank's output slab as its SlabWindowed computes it, with the exchange done by hand: the window
    assembled from the owners' slabs (all in one tensor here) and the layer's fill rows at the edges."""
    geo = geometry(layer)
    extent = x.shape[2]
    windows = halo_windows(
        extent, parts, kernel=geo.kernel[0], stride=geo.stride[0], padding=geo.padding[0], dilation=geo.dilation[0]
    )
    outputs = []
    for rank, window in enumerate(windows):
        slab_layer = SlabWindowed(layer, rank_plan(windows, rank, extent), group=None)
        fill = torch.full_like(x.narrow(2, 0, 1), slab_layer.fill)
        rows = [fill] * window.pad_before
        for piece in window.pieces:
            part = x.narrow(2, piece.start, piece.rows)
            rows.append(torch.full_like(part, slab_layer.fill) if drop_halo and piece.owner != rank else part)
        outputs.append(slab_layer.compute(torch.cat(rows + [fill] * window.pad_after, dim=2)))
    return outputs


@pytest.mark.equivalence
@pytest.mark.equivalence_sse
@pytest.mark.parametrize(("label", "layer", "extent", "parts"), _cases(), ids=[case[0] for case in _cases()])
def test_slab_windows_reproduce_the_whole_layer(label, layer, extent, parts):
    # in float64: the same arithmetic on the same numbers, where only the summation order of a convolution
    # may differ (sums of at most 98 terms of size ~1: ~1e-15 apart, on any kernel), so 1e-12 leaves room
    # for every CPU while a wrong or missing row (~1, see the next test) lands 1e12 times further
    torch.manual_seed(0)
    layer = copy.deepcopy(layer).double()
    dims = 3 if isinstance(layer, nn.Conv3d | nn.MaxPool3d) else 2
    x = torch.randn(2, 2, extent, *([6] * (dims - 1)), dtype=torch.float64)
    whole = layer(x)
    slabs = _slab_outputs(layer, x, parts)
    assert all(s.shape[2] == whole.shape[2] // parts for s in slabs)
    torch.testing.assert_close(torch.cat(slabs, dim=2), whole, rtol=1e-12, atol=1e-12)


def test_dropping_the_halo_changes_the_boundary_rows():
    """What a per-slab convolution with its own zero padding computes: the check above would catch it."""
    torch.manual_seed(0)
    layer, x = nn.Conv2d(2, 3, 3, padding=1).double(), torch.randn(2, 2, 16, 6, dtype=torch.float64)
    wrong = torch.cat(_slab_outputs(layer, x, 2, drop_halo=True), dim=2)
    difference = (wrong - layer(x)).abs().amax(dim=(0, 1, 3))
    assert difference[7] > 1e-2 and difference[8] > 1e-2  # the rows beside the slab boundary
    assert difference[:7].max() < 1e-12 and difference[9:].max() < 1e-12


def test_halo_rows_of_the_zoo_layers():
    # 3×3, stride 1, pad 1 on 32 rows over 2 ranks: one row from each neighbour, one pad row at each edge
    top, bottom = halo_windows(32, 2, kernel=3, stride=1, padding=1)
    assert (top.start, top.stop, top.pad_before, top.pad_after) == (-1, 17, 1, 0)
    assert top.pieces == (Piece(owner=0, start=0, stop=16), Piece(owner=1, start=16, stop=17))
    assert (bottom.start, bottom.stop, bottom.pad_before, bottom.pad_after) == (15, 33, 0, 1)
    assert bottom.pieces == (Piece(owner=0, start=15, stop=16), Piece(owner=1, start=16, stop=32))
    # ImageNet stem, 7×7 stride 2 pad 3: asymmetric halo, 2 rows down to rank 0, 3 rows up to rank 1
    stem = halo_windows(32, 2, kernel=7, stride=2, padding=3)
    assert [rank_plan(stem, r, 32).halo_rows for r in (0, 1)] == [2, 3]
    assert rank_plan(stem, 0, 32).sends == (Piece(owner=1, start=13, stop=16),)
    # its 3×3 stride-2 max-pool: rank 0's windows end inside its slab; only rank 1 reads one row of rank 0
    pool = halo_windows(16, 2, kernel=3, stride=2, padding=1)
    assert [rank_plan(pool, r, 16).halo_rows for r in (0, 1)] == [0, 1]
    assert not rank_plan(pool, 1, 16).sends
    # the residual shortcut (1×1, stride 2) reads only its own rows: no messages at all
    assert not any(rank_plan(halo_windows(16, 2, kernel=1, stride=2, padding=0), r, 16).communicates for r in (0, 1))
    # a dilated 5×5 on 2-row slabs reads two ranks away
    assert {p.owner for p in halo_windows(8, 4, kernel=5, stride=1, padding=4, dilation=2)[1].pieces} == {0, 1, 2, 3}


def test_extents_that_do_not_split_are_refused():
    assert output_extent(28, kernel=7, stride=2, padding=3, dilation=1) == 14
    with pytest.raises(ValueError, match="equal slabs"):
        halo_windows(14, 2, kernel=3, stride=2, padding=1)  # 7 output rows
    with pytest.raises(ValueError, match="equal slabs"):
        halo_windows(30, 4, kernel=3, stride=1, padding=1)  # 30 input rows


@pytest.mark.parametrize(("parts", "children", "layers"), [(2, 4, 9), (8, 4, 9), (16, 3, 6)])
def test_region_ends_where_the_extent_stops_splitting(parts, children, layers):
    # resnet8 on 32×32: stem and stage 1 at 32 rows, stage 2 at 16, stage 3 at 8 (one row each on 8 ranks,
    # too few on 16), then the head, whose adaptive pool ends the region
    model = build_resnet8(sample_shape=(3, 32, 32), num_outputs=10, norm="group")
    region = plan_region(model, torch.zeros(1, 3, 32, 32), parts)
    assert (region.children, len(region.layers)) == (children, layers)
    assert region.reason.startswith(f"child {children}:")


# --------------------------------------------------------------------------- real ranks against a reference


# Slab-shaped convolutions round a sample's forward otherwise than whole ones, so every training here is
# compared in float64 (tests/float64.py): resnet8 on 8 samples is chaotic in float32 with BatchNorm (the
# real run ended 0.65 bounds away on AVX2 kernels, 1/500 on scalar ones; tests/chaos.py's perturbed
# references 47-52 bounds away) and on the edge of it with GroupNorm (perturbed references 0.03 bounds
# away on AVX2 kernels, 42 on scalar ones for one noise seed). One case per strategy also runs for real:
# its record and first loss in float32.
@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.parametrize(
    ("norm", "threads", "real_run"),
    [
        pytest.param("group", 1, True, marks=pytest.mark.equivalence_sse),
        ("batch", 1, False),  # BatchNorm too: statistics span every rank's slab
        pytest.param("group", 2, False, id="group-threads2"),  # other groupings of the slabs' sums
    ],
)
def test_spatial_matches_single_process(tmp_path, norm, threads, real_run):
    check = check_against_reference_float64(
        tmp_path,
        real_run=real_run,
        strategy="spatial",
        model="resnet8",
        dataset="cifar10",
        nodes=1,
        ranks_per_node=2,
        batch_size=8,
        model_options=(("norm", norm),),
        shards=1,  # every rank sees the whole batch: the statistics are the full batch's
        threads=threads,
    )
    for facts in check.facts:
        assert [f["coords"]["sp"] for f in facts] == [0, 1] and all(f["mesh"] == {"sp": 2} for f in facts)
        # stem and three blocks run on slabs; the head (adaptive pool, flatten, linear) runs replicated
        assert all(f["spatial_children"] == 4 == f["gather_before_child"] for f in facts)
        assert all(f["split_layers"] == 9 and f["slab_rows_first"] == 16 and f["slab_rows_last"] == 4 for f in facts)
        assert all(f["halo_rows"]["0.0"] == 1 for f in facts)  # the stem's 3×3: one row from the neighbour
        assert [f["halo_rows"]["2.conv1"] for f in facts] == [0, 1]  # 3×3 stride 2: only rank 1 reads across


# float32 training of resnet20 on these batches is chaotic: the single-process reference against itself
# with its initial weights scaled by 1 + 1e-7·noise ends 1e-4 apart after 4 steps (BatchNorm), as ReLUs
# near zero flip. In float64 nothing flips, and the same spatial run ends within 1/15 of the float64
# rounding bound (u = 2^-53, ~1e-12 of the movement), which a wrong halo row or statistic (>= 1e-5)
# overshoots by millions.
@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.parametrize("norm", ["group", "batch"])
def test_spatial_resnet20_matches_single_process_in_float64(tmp_path, norm):
    check_against_reference_float64(
        tmp_path,
        strategy="spatial",
        model="resnet20",
        dataset="cifar10",
        nodes=1,
        ranks_per_node=2,
        batch_size=8,
        model_options=(("norm", norm),),
    )


# dp × sp: in float64 like spatial (above); with BatchNorm over each replica's 4 samples the real run ended
# 3.2 float32 bounds away under oneDNN's AVX-512 kernels (1/300 of it on AVX2 ones)
@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.parametrize(
    ("norm", "shards", "real_run"),
    [("group", 1, True), ("batch", 2, False)],  # BatchNorm: per replica
)
def test_dp_spatial_matches_single_process(tmp_path, norm, shards, real_run):
    check = check_against_reference_float64(
        tmp_path,
        real_run=real_run,
        strategy="dp_spatial",
        model="resnet8",
        dataset="cifar10",
        nodes=1,
        ranks_per_node=4,
        split=2,
        batch_size=4,
        model_options=(("norm", norm),),
        shards=shards,
    )
    for facts in check.facts:
        assert [(f["coords"]["dp"], f["coords"]["sp"]) for f in facts] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert all(f["mesh"] == {"dp": 2, "sp": 2} for f in facts)


# (model, dataset, options, module, children on slabs, {layer: halo rows on rank 0 and 1}); the halo rows are
# those test_halo_rows_of_the_zoo_layers derives by hand. In float64 like resnet8 (above): resnet18 and
# cosmoflow are chaotic in float32 (tests/chaos.py: perturbed references up to 0.98 and 3.6 bounds away;
# cosmoflow's real run ended 3.6 bounds away under oneDNN's AVX-512 kernels)
_ZOO = [
    # VGG-11 on 32×32 over 2 ranks: 3×3 convs read a row from the neighbour, 2×2 max-pools none; the
    # seventh conv block ends at 1 row
    (
        "vgg11",
        "cifar10",
        (("norm", "group"),),
        "ddlbench.train.models.vgg",
        7,
        {"0.0": [1, 1], "0.3": [0, 0]},
    ),
    # the ImageNet stem on 32×32: 7×7/2 conv to 16 rows (halo 2 and 3), 3×3/2 max-pool to 8 (halo 0 and 1),
    # stages at 8, 4 and 2 rows; the last stage's 1 row does not split, so it runs replicated
    (
        "resnet18",
        "cifar10",
        (("norm", "group"), ("stem", "imagenet")),
        "ddlbench.train.models.resnet",
        7,
        {"0.0": [2, 3], "0.3": [0, 1], "3.shortcut.0": [0, 0]},
    ),
    # 3-D, split along depth: 32, 16, 8, 4 planes, then the fifth block's 1 plane does not split
    ("cosmoflow", "cosmoflow32", (("norm", "group"),), "ddlbench.train.models.cosmoflow", 4, {"0.0": [1, 1]}),
]


@pytest.mark.slow
@pytest.mark.equivalence
@pytest.mark.parametrize(
    ("model", "dataset", "options", "module", "children", "halo"), _ZOO, ids=["vgg11", "resnet18", "cosmoflow"]
)
def test_spatial_zoo_models_match_single_process(tmp_path, model, dataset, options, module, children, halo):
    if not _has(module):
        pytest.skip(f"{module} is not written yet")
    facts = check_against_reference_float64(
        tmp_path,
        strategy="spatial",
        model=model,
        dataset=dataset,
        nodes=1,
        ranks_per_node=2,
        batch_size=4,
        model_options=options,
    ).run.facts
    assert all(f["spatial_children"] == children for f in facts), facts[0]["gather_reason"]
    for layer, rows in halo.items():
        assert [f["halo_rows"][layer] for f in facts] == rows, layer


def test_layers_that_cannot_run_on_slabs_are_named():
    assert "padding_mode" in geometry(nn.Conv2d(1, 1, 3, padding=1, padding_mode="reflect"))
    assert "indices" in geometry(nn.MaxPool2d(2, return_indices=True))
    assert "divisor" in geometry(nn.AvgPool2d(3, padding=1, count_include_pad=False))
    assert geometry(nn.AvgPool2d(3, padding=(0, 1), count_include_pad=False)).padding == (0, 1)  # not along dim 2
    # a ceil-mode pool whose extra output row no window arithmetic gives ends the region at its child
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.MaxPool2d(3, stride=2, ceil_mode=True), nn.Flatten())
    region = plan_region(model, torch.zeros(1, 1, 16, 16), 2)
    assert region.children == 1 and "ceil_mode" in region.reason
