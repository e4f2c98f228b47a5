"""Registries: every entry resolves to working code; duplicates are refused; a miss names the known entries."""

from __future__ import annotations

import pytest
import torch

from ddlbench.catalog import DATASETS, MODELS, STRATEGIES, ModelSpec, Registry, resolve_builder
from ddlbench.train.kernel import build_model
from tests.conftest import make_point


@pytest.mark.parametrize("model", MODELS.names())
@pytest.mark.parametrize("dataset", DATASETS.names())
def test_every_model_builds_for_every_dataset_and_gives_logits(model, dataset):
    for norm in MODELS.get(model).options["norm"]:
        net = build_model(make_point(model=model, dataset=dataset, model_options=(("norm", norm),)))
        spec = DATASETS.get(dataset)
        out = net(torch.randn(2, *spec.sample_shape))
        assert out.shape == (2, spec.num_classes)


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
    spec = ModelSpec(name="m1", builder="x:y", input_kind="image2d", default_batch_size=1, description="")
    registry.register(spec)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(spec)
    with pytest.raises(ValueError, match="must match"):
        registry.register(
            ModelSpec(name="Bad-Name", builder="x:y", input_kind="image2d", default_batch_size=1, description="")
        )
    with pytest.raises(KeyError, match="known models: m1"):
        registry.get("m2")
