"""Writes the catalog's layer table (ddlbench/catalog/layers.json) from the real torch models.

    python -m ddlbench.train.build_layer_table          # rewrite the table
    python -m ddlbench.train.build_layer_table --check  # exit 1 if the committed table is out of date

A build tool, run by hand after a model, a dataset or a split rule changes (tests/test_catalog.py
fails until it is): unlike the rest of the catalog it imports torch and the strategies, because the
facts it writes must be read off the modules exactly as the strategies read them at run time. Every
model of a family the ParaDL strategies split is built on the meta device for every dataset of its
input kind and every value of the options that change its layers, and probed once on one sample.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any

import torch

from ddlbench.atomic import write_text_atomic
from ddlbench.catalog import DATASETS, MODELS, STRATEGIES, resolve_builder
from ddlbench.catalog.layer_table import REGENERATE, TABLE_PATH, entry_key
from ddlbench.train.strategies.flops import FLOP_LAYERS, count_model_flops
from ddlbench.train.strategies.halo import NORMS
from ddlbench.train.strategies.paradl import layer_facts
from ddlbench.train.strategies.spatial import POINTWISE, child_facts

PARADL = ("filter", "channel", "spatial")


def split_families() -> set[str]:
    return {family for name in PARADL for family in STRATEGIES.get(name).families}


def _build(model: str, dataset: str, options: dict[str, str]) -> torch.nn.Module:
    spec, data = MODELS.get(model), DATASETS.get(dataset)
    with torch.device("meta"):  # shapes only: no memory, no arithmetic
        return resolve_builder(spec.builder)(
            sample_shape=data.sample_shape, num_outputs=data.num_outputs, **options, **dict(spec.shape)
        )


def layer_signature(model: str, dataset: str, options: dict[str, str]) -> tuple[tuple[str, str, str], ...]:
    """The leaf layers the table describes (norms and pointwise layers left out), with their settings: two
    builds with the same signature have the same entry, so only one of them needs the (slower) probe."""
    net = _build(model, dataset, options)
    return tuple(
        (name, type(module).__name__, re.sub(r", bias=(True|False)", "", module.extra_repr()))  # FLOPs omit bias
        for name, module in net.named_modules()
        if next(module.children(), None) is None and not isinstance(module, POINTWISE + NORMS)
    )


def probe_entry(model: str, dataset: str, options: dict[str, str]) -> dict[str, Any]:
    """One (model, dataset, options) entry: forward FLOPs, the input's split extent, the convolution and
    linear layers, and the top-level children, as lists (the table's rows)."""
    data = DATASETS.get(dataset)
    net = _build(model, dataset, options)
    flops = count_model_flops(net, torch.zeros((1, *data.sample_shape), device="meta"))
    layers = [
        layer_facts(name, module, flops.layers[name])
        for name, module in net.named_modules()
        if isinstance(module, FLOP_LAYERS)
    ]
    counted = sum(layer.flops for layer in layers)
    if counted != flops.total:  # the table would not explain all the model's FLOPs
        raise RuntimeError(f"{model} on {dataset}: its layers count {counted} FLOPs, FlopCounterMode {flops.total}")
    children = [child_facts(str(index), child, flops.shapes) for index, child in enumerate(net)]
    return {
        "flops": flops.total,
        "extent": data.sample_shape[1],
        "layers": [[x.name, x.type, x.in_channels, x.out_channels, x.groups, x.padding_mode, x.flops] for x in layers],
        "children": [
            [
                child.calls,
                list(child.in_shape),
                list(child.out_shape),
                [[w.name, w.blocked, w.extent, w.out_extent] for w in child.windowed],
            ]
            for child in children
        ],
    }


def build_model_entries(model: str) -> dict[str, Any]:
    """The options that change `model`'s layers (found by trying every value) and its entries."""
    spec = MODELS.get(model)
    datasets = [name for name in DATASETS.names() if DATASETS.get(name).input_kind == spec.input_kind]
    defaults = spec.default_options()
    base = {dataset: layer_signature(model, dataset, defaults) for dataset in datasets}
    shape_options = [
        option
        for option, values in spec.options.items()
        if any(
            layer_signature(model, dataset, defaults | {option: value}) != base[dataset]
            for value in values[1:]
            for dataset in datasets
        )
    ]
    entries: dict[str, Any] = {}
    for dataset in datasets:
        probed: dict[tuple, str] = {}  # signature -> the first key probed with it
        for values in itertools.product(*(spec.options[option] for option in shape_options)):
            options = defaults | dict(zip(shape_options, values, strict=True))
            key = entry_key(dataset, options, shape_options)
            signature = base[dataset] if options == defaults else layer_signature(model, dataset, options)
            if signature in probed:
                entries[key] = probed[signature]  # a key: the same layers as that entry's
            else:
                entries[key], probed[signature] = probe_entry(model, dataset, options), key
    return {"shape_options": shape_options, "entries": entries}


def build_table() -> dict[str, Any]:
    families = split_families()
    return {
        "about": "per (model, dataset, options that change the layers): forward FLOPs of one sample, the input's "
        "extent along dim 2, the convolution and linear layers [name, type, in, out, groups, padding_mode, "
        "flops], and the top-level children [calls, input shape, output shape, leaf layers up to the first "
        "that cannot run on slabs: [name, why not (null: it can), extent, output extent]]",
        "regenerate": REGENERATE,
        "torch": torch.__version__.split("+")[0],
        "models": {name: build_model_entries(name) for name in MODELS.names() if MODELS.get(name).family in families},
    }


def render(table: dict[str, Any]) -> str:
    """The table as JSON with one layer or child per line, so a change shows as a readable diff."""
    out = ["{"]
    for key in ("about", "regenerate", "torch"):
        out.append(f"  {json.dumps(key)}: {json.dumps(table[key])},")
    out.append('  "models": {')
    models = list(table["models"].items())
    for m, (model, data) in enumerate(models):
        out.append(f"    {json.dumps(model)}: {{")
        out.append(f'      "shape_options": {json.dumps(data["shape_options"])},')
        out.append('      "entries": {')
        entries = list(data["entries"].items())
        for e, (key, entry) in enumerate(entries):
            tail = "," if e < len(entries) - 1 else ""
            if isinstance(entry, str):
                out.append(f"        {json.dumps(key)}: {json.dumps(entry)}{tail}")
                continue
            out.append(f"        {json.dumps(key)}: {{")
            out.append(f'          "flops": {entry["flops"]},')
            out.append(f'          "extent": {entry["extent"]},')
            for field in ("layers", "children"):
                rows = entry[field]
                out.append(f'          "{field}": [')
                out += [
                    f"            {json.dumps(row)}{',' if r < len(rows) - 1 else ''}" for r, row in enumerate(rows)
                ]
                out.append("          ]" + ("," if field == "layers" else ""))
            out.append(f"        }}{tail}")
        out.append("      }")
        out.append("    }" + ("," if m < len(models) - 1 else ""))
    out += ["  }", "}"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the committed table")
    parser.add_argument("--out", type=Path, default=TABLE_PATH)
    args = parser.parse_args(argv)
    text = render(build_table())
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date; regenerate it with `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    write_text_atomic(args.out, text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
