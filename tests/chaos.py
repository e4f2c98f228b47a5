"""Whether a fixture's training is chaotic at the scale of rounding, whatever the CPU: the single-process
reference against itself with noise of one rounding added where another kernel may round otherwise.

Two correct runs of a point differ by how their sums are grouped. Where training is smooth, that moves
the result by a small part of the `RoundingBound` (tests/equivalence.py); where a ReLU input, a max-pool
near a tie or a normalisation over few samples sits within a rounding of its gate, a regrouped sum flips
it and the run ends many bounds away, on one CPU's kernels and not another's (the dp × spatial and
cosmoflow tests passed here at 1/300 of their bound and failed 3.2 and 3.6 bounds away under oneDNN's
AVX-512 kernels). Which gates are that close depends on the fixture, not on the CPU, so perturbing the
reference by the size of a rounding, with noise drawn from a fixed seed, finds them here:

- `forward=True`: every convolution and linear output gets absolute noise u·sqrt(fan-in)·rms(output),
  the rounding of a sum of fan-in terms of that size (in any grouping), where a strategy computes a
  sample's forward in other sums than one process (spatial slabs, split input channels, row-parallel
  layers);
- always: every weight gradient gets u·sqrt(K)·rms(gradient) (K: the step's longest sum), where a
  strategy sums a gradient in other groups (an all-reduce, micro-batches, shards).

A fixture is fit for a float32 comparison when every seed's perturbed reference ends within
`FIT_SHARE` of the bound; else it is compared in float64 (tests/float64.py), where no such noise
reaches a gate. The noise is as large as a rounding can be, so a verdict near the edge can differ with
the kernels the reference itself runs on (resnet8 with GroupNorm on 8 samples, forward noise: 0.03 on
AVX2 kernels, 42 for one seed on scalar ones): run it on two (ATEN_CPU_CAPABILITY=default
ONEDNN_MAX_CPU_ISA=SSE41) and take the worse. Data and pipeline parallelism compute a sample's forward
in the same sums as one process, as long as no kernel rounds a sample otherwise in a batch of 8 than in
one of 16: their resnet8 fixtures at a global batch of 16 pass the gradient noise (0.03) and would not
pass forward noise (20-24 bounds), so a CPU whose kernels are not batch-invariant shows up there first.
Run `python -m tests.chaos '<point fields as JSON>' [--shards N] [--forward]`.
"""

from __future__ import annotations

import argparse
import json
import math

import torch
from torch import Tensor, nn

from ddlbench.catalog import DATASETS
from ddlbench.point import Point
from ddlbench.train.kernel import MOMENTUM, step_batches
from ddlbench.train.losses import loss_for
from tests.equivalence import UNIT_ROUNDOFF, layout_point, parameter_names, rounding_bound, rounding_ratios
from tests.reference import as_dtype, build_model_as

# a fixture whose perturbed references all end within this share of the bound may be compared in float32
FIT_SHARE = 0.25


def train_perturbed(
    point: Point, *, shards: int = 1, dtype: torch.dtype = torch.float32, forward: bool, seed: int | None
) -> dict[str, torch.Tensor]:
    """tests/reference.py's training, with rounding-sized noise drawn from `seed` (None: no noise)."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(point.threads)
    try:
        return _train(point, shards=shards, dtype=dtype, forward=forward, seed=seed)
    finally:
        torch.set_num_threads(previous_threads)


def _train(point: Point, *, shards: int, dtype: torch.dtype, forward: bool, seed: int | None) -> dict[str, Tensor]:
    model = build_model_as(point, dtype)
    u = UNIT_ROUNDOFF[dtype]
    terms = rounding_bound(point, model).terms
    if seed is not None:
        noise = torch.Generator().manual_seed(seed)

        def jitter(tensor: torch.Tensor, sums: int) -> torch.Tensor:
            scale = u * math.sqrt(sums) * tensor.detach().square().mean().sqrt()
            return tensor + scale * torch.randn(tensor.shape, generator=noise, dtype=tensor.dtype)

        for module in model.modules():
            if forward and isinstance(module, nn.Linear | nn.modules.conv._ConvNd):
                fan_in = module.weight[0].numel()
                module.register_forward_hook(lambda _m, _i, out, fan_in=fan_in: jitter(out, fan_in))
        for parameter in model.parameters():
            parameter.register_hook(lambda grad: jitter(grad, terms))
    loss_fn = loss_for(DATASETS.get(point.dataset).task)
    optimizer = torch.optim.SGD(model.parameters(), lr=point.learning_rate, momentum=MOMENTUM)
    batches = step_batches(point, 0, point.global_batch_size, torch.device("cpu"))
    for step in range(point.warmup_steps + point.steps):
        inputs, targets = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=True)
        for x, y in zip(inputs.chunk(shards), targets.chunk(shards), strict=True):
            (loss_fn(model(as_dtype(x, dtype)), y) / shards).backward()
        optimizer.step()
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def perturbed_ratios(
    point: Point, *, shards: int = 1, dtype: torch.dtype = torch.float32, forward: bool, seeds: int = 3
) -> list[float]:
    """For each noise seed: the worst error/bound of the perturbed reference against the plain one."""
    want = train_perturbed(point, shards=shards, dtype=dtype, forward=forward, seed=None)
    model = build_model_as(point, dtype)
    names = parameter_names(model)
    bound = rounding_bound(point, model)
    ratios = []
    for seed in range(seeds):
        got = train_perturbed(point, shards=shards, dtype=dtype, forward=forward, seed=seed)
        ratios.append(max(rounding_ratios(got, {n: want[n] for n in names}, model.state_dict(), bound).values()))
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fields", help="the point's fields as JSON (lists for tuples), as a test passes them")
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--forward", action="store_true", help="the strategy computes the forward in other sums")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = parser.parse_args()
    fields = json.loads(args.fields)
    fields = {key: tuple(map(tuple, value)) if key == "model_options" else value for key, value in fields.items()}
    point = layout_point(**fields)
    ratios = perturbed_ratios(
        point, shards=args.shards, dtype=getattr(torch, args.dtype), forward=args.forward, seeds=args.seeds
    )
    verdict = "fit for float32" if max(ratios) <= FIT_SHARE else "chaotic: compare in float64"
    print(f"{point.point_id} {args.dtype}: perturbed/bound {' '.join(f'{r:.3g}' for r in ratios)}: {verdict}")


if __name__ == "__main__":
    main()
