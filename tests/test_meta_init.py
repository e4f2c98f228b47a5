"""Initial weights drawn module by module (ddlbench.train.models.init): the same numbers whatever device
and order a model is materialised in, and sharded strategies (fsdp, tensor, dp_tp) that materialise
only their own shards, so a rank's setup peak is about its share of the model, not the whole."""

from __future__ import annotations

import json
import logging
import math
import random

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ddlbench.train.kernel import build_model, strategy_setup
from ddlbench.train.memory import MemoryProbe
from ddlbench.train.models.gpt import INIT_STD
from ddlbench.train.models.init import draw_module, init_plan, local_piece, materialise, module_seed
from ddlbench.train.strategies import RankContext, build_trainer
from ddlbench.train.strategies.tensor import COLWISE, ROWWISE
from tests.conftest import leave_spawned_rank, make_point
from tests.equivalence import layout_point

log = logging.getLogger(__name__)

CASES = [
    ("resnet8", "cifar10", (("norm", "batch"),)),  # BatchNorm: running statistics are buffers to fill
    ("vgg11", "cifar10", (("norm", "none"),)),  # He-normal convolutions with biases, default Linears
    ("mobilenet_v2", "cifar10", (("norm", "batch"),)),
    ("gpt_tiny", "tokens_small", ()),  # GPT-2's rule: scaled residual projections, embeddings
]


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert [name for name in a if not torch.equal(a[name], b[name])] == []


@pytest.mark.parametrize(("model", "dataset", "options"), CASES, ids=[c[0] for c in CASES])
def test_meta_then_materialised_in_any_order_equals_the_plain_build(model, dataset, options):
    point = make_point(model=model, dataset=dataset, model_options=options, seed=3)
    plain = state(build_model(point))
    assert_same_state(plain, state(build_model(point)))  # deterministic

    # the strategies' path: shapes only, then materialised
    meta = build_model(point, materialise=False)
    assert all(t.is_meta for t in [*meta.parameters(), *meta.buffers()])
    assert_same_state(plain, state(materialise(meta, torch.device("cpu"))))

    # module by module in a shuffled order, with unrelated draws in between: each module's numbers
    # depend on (seed, its name) alone
    meta = build_model(point, materialise=False).to_empty(device="cpu")
    plan = init_plan(meta)
    modules = list(meta.named_modules())
    random.Random(0).shuffle(modules)
    with torch.no_grad():
        for name, module in modules:
            torch.rand(7)  # the global generator's position must not matter
            if any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False)):
                drawn = draw_module(plan, name, module)
                for key, value in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
                    value.copy_(drawn[key])
    assert_same_state(plain, state(meta))

    other = state(build_model(make_point(model=model, dataset=dataset, model_options=options, seed=4)))
    assert not all(
        torch.equal(plain[k], other[k]) for k in plain if plain[k].is_floating_point() and plain[k].std() > 0
    )


def test_buffers_are_initialised_not_left_as_empty_memory():
    point = make_point(model="resnet8", dataset="cifar10", model_options=(("norm", "batch"),))
    model = materialise(build_model(point, materialise=False), torch.device("cpu"))
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms
    for norm in norms:
        assert torch.equal(norm.running_mean, torch.zeros_like(norm.running_mean))
        assert torch.equal(norm.running_var, torch.ones_like(norm.running_var))
        assert norm.num_batches_tracked.item() == 0
        assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and not norm.bias.any()


def test_each_module_draws_with_its_init_function_and_scale_from_its_own_seed():
    """The distributions are the models' own (He-normal fan-out convolutions, PyTorch's default Linear,
    GPT-2's N(0, 0.02) and 0.02/sqrt(2·layers)); only the stream is per module now."""

    def expected(seed: int, name: str, shape: tuple[int, ...], init) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(module_seed(seed, name))
            tensor = torch.empty(shape)
            init(tensor)
        return tensor

    vgg = build_model(make_point(model="vgg11", dataset="cifar10", model_options=(("norm", "none"),), seed=5))
    conv = vgg[1][0]
    want = expected(
        5, "1.0", conv.weight.shape, lambda t: nn.init.kaiming_normal_(t, mode="fan_out", nonlinearity="relu")
    )
    assert torch.equal(conv.weight, want) and not conv.bias.any()
    linear = vgg[-1][0]
    want = expected(5, f"{len(vgg) - 1}.0", linear.weight.shape, lambda t: nn.init.kaiming_uniform_(t, a=math.sqrt(5)))
    assert torch.equal(linear.weight, want)  # nn.Linear.reset_parameters draws its weight first

    gpt = build_model(make_point(model="gpt_tiny", dataset="tokens_small", model_options=(), seed=5))
    layers = len(gpt) - 2
    for name, std in [("1.attn.q", INIT_STD), ("1.attn.out", INIT_STD / math.sqrt(2 * layers))]:
        weight = gpt.get_submodule(name).weight
        assert torch.equal(weight, expected(5, name, weight.shape, lambda t, s=std: nn.init.normal_(t, std=s)))
    token = gpt[0].token.weight
    assert torch.equal(token, expected(5, "0.token", token.shape, lambda t: nn.init.normal_(t, std=INIT_STD)))


def test_building_leaves_the_global_generator_where_the_seed_put_it():
    point = make_point(seed=11)
    build_model(point)
    after_build = torch.rand(4)
    torch.manual_seed(11)
    assert torch.equal(after_build, torch.rand(4))


class FakeMesh:
    """The two things local_piece asks of a DeviceMesh."""

    def __init__(self, shape: tuple[int, ...], coordinate: tuple[int, ...]) -> None:
        self.shape, self.coordinate = shape, coordinate

    def get_coordinate(self) -> list[int]:
        return list(self.coordinate)

    def size(self, dim: int) -> int:
        return self.shape[dim]


def piece_of(full: torch.Tensor, coordinate: tuple[int, int], placements) -> list[int]:
    return local_piece(full, FakeMesh((2, 2), coordinate), placements).flatten().tolist()


def test_local_piece_follows_dtensor_and_fsdp2_chunking():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    full = torch.arange(10 * 4).reshape(10, 4)
    # torch.chunk semantics: 10 rows on 4 ranks are 3, 3, 3, 1
    rows = [local_piece(full, FakeMesh((4,), (r,)), [Shard(0)]).shape[0] for r in range(4)]
    assert rows == [3, 3, 3, 1]
    # 2 rows on 4 ranks: chunk gives only two pieces; the others hold an empty one
    pieces = [local_piece(full[:2], FakeMesh((4,), (r,)), [Shard(0)]) for r in range(4)]
    assert [p.shape[0] for p in pieces] == [1, 1, 0, 0] and pieces[2].shape[1] == 4
    assert torch.equal(local_piece(full, FakeMesh((2,), (1,)), [Replicate()]), full)
    assert torch.equal(local_piece(full, FakeMesh((2,), (1,)), [Shard(1)]), full[:, 2:])
    # FSDP2 over a column-wise tp shard (dp, tp) = (_StridedShard(0, sf=2), Shard(0)): the tp shard
    # first (rows 0-3 or 4-7 of 8), then its dp half; plain (Shard(0), Shard(0)) is dp first
    full = torch.arange(8).reshape(8, 1)
    strided = [_StridedShard(0, split_factor=2), Shard(0)]
    got = {
        (d, t): local_piece(full, FakeMesh((2, 2), (d, t)), strided).flatten().tolist() for d in (0, 1) for t in (0, 1)
    }
    assert got == {(0, 0): [0, 1], (1, 0): [2, 3], (0, 1): [4, 5], (1, 1): [6, 7]}
    plain = [Shard(0), Shard(0)]
    got = {
        (d, t): local_piece(full, FakeMesh((2, 2), (d, t)), plain).flatten().tolist() for d in (0, 1) for t in (0, 1)
    }
    assert got == {(0, 0): [0, 1], (0, 1): [2, 3], (1, 0): [4, 5], (1, 1): [6, 7]}
    # row-wise tp (Shard(1)) under FSDP's Shard(0): the dims differ, either order gives the same
    full = torch.arange(16).reshape(4, 4)
    assert torch.equal(local_piece(full, FakeMesh((2, 2), (1, 0)), [Shard(0), Shard(1)]), full[2:, :2])


# --------------------------------------------------------------------------------------------------
# real ranks (gloo, spawned here): what a rank allocates while it builds and shards the model

# What a rank allocates in setup besides its share and the one module drawn whole: the mesh's and
# gloo's small tensors, the sample batch strategy_setup reads. Measured on gpt_small: 5 KB. 1 MiB
# leaves room and stays far below the figures compared (a 9 MiB module, 164 MiB shards).
SETUP_SLACK_BYTES = 2**20


def _rank_main(rank: int, world: int, folder: str, fields: dict, measure: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        fields = {**fields, "model_options": tuple(tuple(o) for o in fields["model_options"])}
        point = layout_point(**fields)
        ctx = RankContext(rank=rank, world_size=world, local_rank=rank, device=torch.device("cpu"), backend="gloo")
        setup = strategy_setup(point, ctx)
        out: dict = {}
        for materialise_first in (False, True) if measure else (False,):
            probe = MemoryProbe(torch.device("cpu"), enabled=True)
            probe.start()
            with probe.probing():  # from before construction to the sharded, materialised model
                model = build_model(point, materialise=materialise_first)
                trainer = build_trainer(point.strategy, model, setup)
            figures = probe.finish(0)
            key = "materialised_first" if materialise_first else "meta"
            out[f"{key}_peak_bytes"] = figures.peak_bytes
            out[f"{key}_local_bytes"] = sum(
                (p.to_local() if hasattr(p, "to_local") else p).numel() * p.element_size()
                for p in trainer.model.parameters()
            )
            if not materialise_first and not measure:
                full = trainer.full_state_dict()  # every rank joins the gathers
                if rank == 0:
                    want = build_model(point).state_dict()
                    out["differ"] = sorted(name for name in want if not torch.equal(full[name], want[name]))
                    out["names"] = sorted(full) == sorted(want)
            del trainer, model
        with open(f"{folder}/rank{rank}.json", "w") as file:
            json.dump(out, file)
    finally:
        dist.destroy_process_group()
    leave_spawned_rank()  # only once the results are written: an error above still fails the rank


def run_ranks(tmp_path, world: int, *, measure: bool, **fields) -> list[dict]:
    fields = {"nodes": 1, "ranks_per_node": world, **fields}
    mp.spawn(_rank_main, args=(world, str(tmp_path), fields, measure), nprocs=world, join=True)
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "world", "model", "dataset", "options", "split"),
    [
        ("fsdp", 2, "resnet8", "cifar10", (("norm", "batch"),), 0),  # buffers, and uneven dim-0 chunks
        ("fsdp", 4, "resnet8", "cifar10", (("norm", "group"),), 0),  # the 10-row head: 3, 3, 3, 1 rows
        ("tensor", 2, "gpt_tiny", "tokens_small", (), 0),
        ("dp_tp", 4, "gpt_tiny", "tokens_small", (), 2),  # 2-D DTensors: FSDP2's strided shard of a tp shard
    ],
)
def test_sharded_materialisation_gathers_to_the_plain_build(tmp_path, strategy, world, model, dataset, options, split):
    """Setup alone, gathered back: the weights a rank starts from, apart from training (which the
    strategies' tests match against a single process)."""
    fields = dict(strategy=strategy, model=model, dataset=dataset, model_options=options, split=split, seed=7)
    results = run_ranks(tmp_path, world, measure=False, **fields)
    assert results[0]["names"] and results[0]["differ"] == []


def largest_module_bytes(model: nn.Module) -> int:
    """The most bytes one module's own parameters and buffers take: what materialise draws at a time."""
    sizes = [
        sum(t.numel() * t.element_size() for t in [*m.parameters(recurse=False), *m.buffers(recurse=False)])
        for m in model.modules()
    ]
    return max(sizes)


def fsdp_share_bytes(model: nn.Module, rank: int, world: int) -> int:
    """A rank's dim-0 chunk (torch.chunk, as FSDP2 cuts) of every parameter, in bytes."""
    total = 0
    for p in model.parameters():
        chunks = torch.chunk(torch.empty(p.shape, device="meta"), world)
        total += (chunks[rank].numel() if rank < len(chunks) else 0) * p.element_size()
    return total


def tp_share_bytes(model: nn.Module, world: int) -> int:
    """The replicated parameters whole, the column-wise ones' rows and the row-wise weights' columns
    divided by the ranks (gpt_small's dimensions divide evenly)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for block in model[1:-1]:
        split = [p for name in COLWISE for p in block.get_submodule(name).parameters()]
        split += [block.get_submodule(name).weight for name in ROWWISE]
        total -= sum(p.numel() * p.element_size() for p in split) * (world - 1) // world
    return total


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "tensor"])
def test_a_ranks_setup_peak_is_its_share_not_the_whole_model(tmp_path, strategy):
    """gpt_small (12 blocks of ~7M parameters, each module at most 3% of the model) on 2 ranks: from
    before the model's construction to the sharded, materialised model, a rank's peak tensor memory
    (the kernel's CPU probe: the allocator total of all threads) is at most its share plus one module
    drawn whole plus a fixed slack, clearly below the whole model; building the model whole first
    (the old way, and the sensitivity check) peaks at the whole model or more."""
    world = 2
    fields = dict(strategy=strategy, model="gpt_small", dataset="tokens_small", model_options=(), seed=0)
    meta = build_model(layout_point(**fields, nodes=1, ranks_per_node=world, split=0), materialise=False)
    whole = sum(t.numel() * t.element_size() for t in [*meta.parameters(), *meta.buffers()])
    largest = largest_module_bytes(meta)
    results = run_ranks(tmp_path, world, measure=True, **fields)
    for rank, result in enumerate(results):
        share = fsdp_share_bytes(meta, rank, world) if strategy == "fsdp" else tp_share_bytes(meta, world)
        bound = share + largest + SETUP_SLACK_BYTES
        log.info(
            "%s rank %d: whole model %d B, share %d B, largest module %d B, bound %d B; setup peak %d B "
            "(built on meta, sharded, then materialised), %d B (built whole first)",
            strategy,
            rank,
            whole,
            share,
            largest,
            bound,
            result["meta_peak_bytes"],
            result["materialised_first_peak_bytes"],
        )
        assert result["meta_local_bytes"] == share  # the share is what the rank really holds
        assert bound < 0.6 * whole  # the bound itself separates a share from the whole model
        assert share <= result["meta_peak_bytes"] <= bound
        assert result["materialised_first_peak_bytes"] >= whole
