"""GPT-2-style decoder-only transformers (Radford et al. 2019): learned positions, pre-norm blocks.

Built as one flat nn.Sequential — the embeddings, one child per block, then the final norm with the
LM head — so pipeline and model-parallel strategies can cut it between top-level children. The
attention and MLP keep their projections as separate nn.Linear modules with stable names
(`attn.q/k/v/out`, `mlp.fc/proj`), which is what tensor parallelism shards column- and row-wise.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddlbench.train.models.init import finish_model

INIT_STD = 0.02  # GPT-2's initializer_range


class Embedding(nn.Module):
    """Token embedding plus a learned position embedding: N×T ids → N×T×d."""

    def __init__(self, vocab: int, context: int, d_model: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(context, d_model)

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.token(ids) + self.position(positions)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with separate q/k/v projections.

    Separate projections (instead of GPT-2's fused c_attn) let tensor parallelism shard each one
    column-wise so a rank holds whole heads; a fused weight would need its rows regrouped per head.
    The same parameter count as the fused layout: 3·(d² + d).
    """

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} does not divide into {heads} heads")
        self.head_dim = d_model // heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        n, t, _ = x.shape
        # -1 heads, not the configured count: under tensor parallelism a rank's q/k/v hold only
        # heads/tp of them, and its projections' outputs are that much narrower
        q, k, v = (proj(x).view(n, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(n, t, -1))


class MLP(nn.Module):
    """d → 4d, GELU (GPT-2's tanh approximation), 4d → d."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU(approximate="tanh")
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """A pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """The final LayerNorm and the LM head: N×T×d → N×T×vocab logits.

    The head's weight is NOT tied to the token embedding (GPT-2 ties them): a pipeline puts the
    embedding and the head on different ranks, which cannot share one parameter. That adds
    vocab·d parameters (38.6M for GPT-2's vocabulary at d=768).
    """

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.lm_head(self.ln(x))


# The projections that write into the residual stream, by their name inside a block
RESIDUAL_WRITERS = (".attn.out", ".mlp.proj")


def init_gpt2_module(name: str, module: nn.Module, *, layers: int) -> bool:
    """GPT-2's initialisation, one module at a time: N(0, 0.02) weights and embeddings, zero biases, and
    the projections that write into the residual stream drawn with std 0.02/sqrt(2·layers), so the
    stream's variance does not grow with depth (two such writes per block). LayerNorms keep PyTorch's
    default (unit scale, zero shift)."""
    if isinstance(module, nn.Linear):
        std = INIT_STD / math.sqrt(2 * layers) if name.endswith(RESIDUAL_WRITERS) else INIT_STD
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
        return True
    if isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
        return True
    return False


def build_gpt(
    *, sample_shape: tuple[int, ...], num_outputs: int, d_model: int, heads: int, layers: int
) -> nn.Sequential:
    """A GPT-2-style model for N×T int64 token ids (T = sample_shape[0], vocabulary num_outputs),
    returning N×T×vocab logits; layers + 2 top-level children, no dropout (benchmarks and
    equivalence checks want a deterministic step)."""
    (context,) = sample_shape
    model = nn.Sequential(
        Embedding(num_outputs, context, d_model),
        *(Block(d_model, heads) for _ in range(layers)),
        Head(d_model, num_outputs),
    )
    return finish_model(model, functools.partial(init_gpt2_module, layers=layers))
