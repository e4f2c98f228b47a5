"""The calibration's update probe against real models' optimizer steps, on this host's CPU.

Prints nanoseconds per parameter element of SGD with momentum, as ddlbench trains:
- `probe warm`: the calibration's probe (ddlbench.train.calibration.kernels.update_probe over --probe-mib MiB of
  parameters), called back to back, as the compute point times it;
- `probe cold`: the same step after the operators point's eviction before each call (operator_kernel.evict_caches:
  EVICT_BYTES of another buffer written), so that no parameter, gradient or momentum element is left in the caches;
- one line per model: its own optimizer step right after its own forward and backward (zero_grad(set_to_none),
  cross-entropy on random inputs of the dataset's shape), as a training step runs it.
Rounds alternate the three kinds, so a slow spell of the host weighs on each alike; each line gives the median, the
range and the count. Whether the probe stands for a real step (the analytic model's update term) is the ratio of a
model's line to `probe warm`.

    python benchmarks/update_probe.py --models alexnet resnet50 vgg16 --dataset stl10 --batch 4
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ddlbench.catalog import DATASETS
from ddlbench.point import Point
from ddlbench.train.calibration.kernels import update_probe
from ddlbench.train.calibration.operator_kernel import evict_caches
from ddlbench.train.kernel import build_model, make_optimizer_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["alexnet", "resnet50", "vgg16"])
    parser.add_argument("--dataset", default="stl10")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--probe-mib", type=int, default=64, help="the probe's parameters (the calibration's: 64)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    elements = args.probe_mib * 2**20 // 4
    cpu = torch.device("cpu")
    probe, _ = update_probe(elements, cpu)

    spec = DATASETS.get(args.dataset)
    if spec.input_kind != "image2d" or spec.task != "classify":
        parser.error(f"--dataset {args.dataset!r}: an image classification dataset (e.g. cifar10, stl10, imagenet)")
    models = {}
    for name in args.models:
        point = Point(model=name, dataset=args.dataset, strategy="ddp", nodes=1, ranks_per_node=1,
                      batch_size=args.batch, threads=1, repetition=0, warmup_steps=1, steps=1, seed=0,
                      learning_rate=1e-3, timeout_s=600.0)  # fmt: skip
        model = build_model(point)
        optimizer = make_optimizer_for(point)(list(model.parameters()))
        x = torch.randn(args.batch, *spec.sample_shape)
        y = torch.randint(0, spec.num_outputs, (args.batch,))
        models[name] = (model, optimizer, x, y, sum(p.numel() for p in model.parameters()))

    def timed(step, before=None) -> float:
        if before:
            before()
        began = time.perf_counter()
        step()
        return time.perf_counter() - began

    per_element: dict[str, list[float]] = {"probe warm": [], "probe cold": [], **{name: [] for name in models}}
    for _ in range(args.rounds):
        per_element["probe warm"] += [timed(probe.step) / elements for _ in range(3)]
        per_element["probe cold"] += [timed(probe.step, lambda: evict_caches(cpu)) / elements for _ in range(3)]
        for name, (model, optimizer, x, y, count) in models.items():
            for _ in range(2):
                optimizer.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x), y).backward()
                per_element[name].append(timed(optimizer.step) / count)

    warm = statistics.median(per_element["probe warm"])
    for name, values in per_element.items():
        size = f"{models[name][4] / 1e6:.1f} M parameters" if name in models else f"{elements / 1e6:.1f} M elements"
        print(
            f"{name:12s} {statistics.median(values) * 1e9:5.2f} ns/element (median of {len(values)}, range "
            f"{min(values) * 1e9:.2f}-{max(values) * 1e9:.2f}; ×{statistics.median(values) / warm:.2f} the warm probe) "
            f"{size}"
        )


if __name__ == "__main__":
    main()
