"""The GPT-2-style model: its shape contract, causality, GPT-2's parameter count and initialisation, and
that it learns the synthetic token task."""

from __future__ import annotations

import math

import pytest
import torch

from ddlbench.catalog import DATASETS, MODELS
from ddlbench.train.data import open_dataset
from ddlbench.train.losses import language_loss
from ddlbench.train.models.gpt import INIT_STD, build_gpt

GPT_MODELS = ["gpt_tiny", "gpt_nano", "gpt_micro", "gpt_mini", "gpt_small", "gpt_medium", "gpt_large"]


def build(model: str, dataset: str = "tokens_small", seed: int = 0) -> torch.nn.Sequential:
    """The model as the kernel builds it: the dataset's shape and vocabulary, the catalog's shape keywords."""
    spec, data = MODELS.get(model), DATASETS.get(dataset)
    torch.manual_seed(seed)
    return build_gpt(sample_shape=data.sample_shape, num_outputs=data.num_outputs, **spec.shape)


def test_logits_cover_every_position_and_the_vocabulary():
    model = build("gpt_tiny")
    ids = torch.randint(0, 512, (3, 64))
    logits = model(ids)
    assert logits.shape == (3, 64, 512) and logits.dtype == torch.float32
    # shorter sequences than the context work too (positions 0..t-1)
    assert model(ids[:, :10]).shape == (3, 10, 512)


@pytest.mark.parametrize("name", GPT_MODELS)
def test_flat_sequential_of_embedding_blocks_and_head(name):
    with torch.device("meta"):  # shapes only: gpt_large is 838M parameters
        model = build(name, "tokens")
    layers = MODELS.get(name).shape["layers"]
    assert isinstance(model, torch.nn.Sequential)
    assert len(model) == layers + 2 == MODELS.get(name).blocks


def test_a_token_changes_no_logit_before_it():
    model = build("gpt_tiny").eval()
    ids = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(1))
    changed = ids.clone()
    t = 37
    changed[:, t] = (changed[:, t] + 1) % 512
    with torch.no_grad():
        before, after = model(ids), model(changed)
    # masked scores add exactly zero weight, so earlier positions compute the same numbers; the
    # tolerance only allows a kernel that blocks the rows differently for different inputs
    torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=1e-6)
    # sensitivity: the changed position and the ones after it do see the change
    assert (after[:, t] - before[:, t]).abs().max() > 1e-3
    assert (after[:, -1] - before[:, -1]).abs().max() > 1e-4


def test_gpt_small_has_gpt2s_124m_parameters_plus_an_untied_head():
    with torch.device("meta"):
        model = build("gpt_small", "tokens")  # GPT-2's vocabulary 50257 and context 1024
    total = sum(p.numel() for p in model.parameters())
    head = model[-1].lm_head.weight.numel()
    assert head == 50257 * 768 == 38_597_376
    # GPT-2 ties the head to the token embedding and counts it once: 124,439,808
    gpt2_count = total - head
    assert gpt2_count == 124_439_808
    assert abs(gpt2_count - 124e6) / 124e6 < 0.01
    assert total == 163_037_184  # what this untied model really holds and trains


def test_init_follows_gpt2():
    torch.manual_seed(0)
    layers = 8
    model = build_gpt(sample_shape=(64,), num_outputs=512, d_model=256, heads=8, layers=layers)
    block = model[1]
    # 65,536 draws: the sample std is within ~0.5% of the true one
    assert block.attn.q.weight.std().item() == pytest.approx(INIT_STD, rel=0.02)
    assert model[0].token.weight.std().item() == pytest.approx(INIT_STD, rel=0.02)
    residual = INIT_STD / math.sqrt(2 * layers)
    assert block.attn.out.weight.std().item() == pytest.approx(residual, rel=0.02)
    assert block.mlp.proj.weight.std().item() == pytest.approx(residual, rel=0.02)
    assert all(
        m.bias.abs().max() == 0 for m in model.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None
    )
    assert model[-1].lm_head.bias is None


def test_heads_must_divide_d_model():
    with pytest.raises(ValueError, match="heads"):
        build_gpt(sample_shape=(8,), num_outputs=16, d_model=30, heads=4, layers=1)


def test_loss_falls_on_tokens_small():
    torch.set_num_threads(1)
    model = build("gpt_tiny")
    data = open_dataset(DATASETS.get("tokens_small"), seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(12):
        ids, targets = data.batch(step * 8, 8)
        optimizer.zero_grad(set_to_none=True)
        loss = language_loss(model(ids), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # starts near ln(512) = 6.24 (uniform guessing), and must learn part of the token rule in 12 steps
    assert losses[0] == pytest.approx(math.log(512), abs=0.3)
    assert losses[-1] < losses[0] - 0.5, losses
