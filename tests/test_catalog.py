"""Registries: every entry resolves to working code; duplicates are refused; a miss names the known entries."""

from __future__ import annotations

import pytest
import torch

from ddlbench.catalog import DATASETS, MODELS, STRATEGIES, ModelSpec, Registry, resolve_builder
from ddlbench.train.kernel import build_model
from tests.conftest import make_point


@pytest.mark.parametrize("model", MODELS.names())
def test_every_model_builds_its_declared_blocks_for_each_dataset_of_its_input_kind_and_refuses_others(model):
    """Every entry resolves to working code; tests/test_models.py checks the CNNs' outputs and gradients."""
    spec = MODELS.get(model)
    options = tuple(spec.default_options().items())
    takes = [name for name in DATASETS.names() if DATASETS.get(name).input_kind == spec.input_kind]
    assert takes, f"no dataset gives {spec.input_kind} input"
    for dataset in takes:
        with torch.device("meta"):  # shapes only: even the largest model costs no memory and no arithmetic
            net = build_model(make_point(model=model, dataset=dataset, model_options=options))
        assert isinstance(net, torch.nn.Sequential) and len(net) == spec.blocks, dataset
    other = next(name for name in DATASETS.names() if DATASETS.get(name).input_kind != spec.input_kind)
    with pytest.raises(ValueError, match=f"takes {spec.input_kind} input"):
        build_model(make_point(model=model, dataset=other, model_options=options))


@pytest.mark.parametrize("strategy", STRATEGIES.names())
def test_every_strategy_resolves_to_its_parallelize_function(strategy):
    builder = resolve_builder(STRATEGIES.get(strategy).builder)
    assert builder.__name__ == f"parallelize_{strategy}"


def test_same_seed_same_weights_other_seed_other_weights():
    a, b, c = (build_model(make_point(seed=s)).state_dict() for s in (0, 0, 1))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_registry_refuses_duplicates_and_bad_names_and_lists_known_entries():
    registry: Registry[ModelSpec] = Registry("model")
    spec = ModelSpec(
        name="m1", builder="x:y", family="cnn2d", input_kind="image2d", default_batch_size=1, description="", blocks=1
    )
    registry.register(spec)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(spec)
    with pytest.raises(ValueError, match="must match"):
        registry.register(
            ModelSpec(
                name="Bad-Name",
                builder="x:y",
                family="cnn2d",
                input_kind="image2d",
                default_batch_size=1,
                description="",
                blocks=1,
            )
        )
    with pytest.raises(KeyError, match="known models: m1"):
        registry.get("m2")


def test_the_layer_table_is_what_the_models_build_today():
    """ddlbench/catalog/layers.json, from which planning predicts what a ParaDL split splits, is rebuilt from
    the real models; after changing a model, a dataset or a split rule, regenerate it with the command named."""
    import difflib

    from ddlbench.catalog.layer_table import REGENERATE, TABLE_PATH
    from ddlbench.train.build_layer_table import build_table, render

    def content(text: str) -> list[str]:  # the torch release that built the table is a note, not content
        return [line for line in text.splitlines() if not line.lstrip().startswith('"torch":')]

    committed, fresh = content(TABLE_PATH.read_text()), content(render(build_table()))
    changes = list(difflib.unified_diff(committed, fresh, "committed", "fresh", lineterm=""))
    assert not changes, f"{TABLE_PATH.name} is out of date; regenerate it with `{REGENERATE}`:\n" + "\n".join(
        changes[:30]
    )
