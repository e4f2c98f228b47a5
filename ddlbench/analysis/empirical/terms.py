"""The terms of the performance-model normal form (PMNF, Calotoiu et al., SC13; Extra-P):

    f(x₁ … x_m) = c₀ + Σ_k c_k · Π_l x_l^{i_kl} · log2(x_l)^{j_kl}

A Factor is one x^i·log2(x)^j of one parameter; a Term is a product of factors (one per parameter it
involves). Exponents are exact fractions so that formulas print as Extra-P's do (x^(3/2)·log2(x)).
Besides Extra-P's monomials, ddlbench's own search may use a *saturating* factor (x−1)/x: the share of a
ring collective's bytes each rank sends, 2(p−1)/p for all-reduce (Thakur, Rabenseifner and Gropp,
IJHPCA 2005), which PMNF can only approximate by a small power.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

# Extra-P 4.2.5's default single-parameter building blocks, in its order (the order breaks ties):
# (i, j, k) is x^(i/j)·log2(x)^k (extrap/modelers/single_parameter/basic.py, create_default_building_blocks)
EXTRAP_EXPONENTS = (
    (0, 1, 1), (0, 1, 2), (1, 4, 0), (1, 3, 0), (1, 4, 1), (1, 3, 1), (1, 4, 2), (1, 3, 2), (1, 2, 0),
    (1, 2, 1), (1, 2, 2), (2, 3, 0), (3, 4, 0), (2, 3, 1), (3, 4, 1), (4, 5, 0), (2, 3, 2), (3, 4, 2),
    (1, 1, 0), (1, 1, 1), (1, 1, 2), (5, 4, 0), (5, 4, 1), (4, 3, 0), (4, 3, 1), (3, 2, 0), (3, 2, 1),
    (3, 2, 2), (5, 3, 0), (7, 4, 0), (2, 1, 0), (2, 1, 1), (2, 1, 2), (9, 4, 0), (7, 3, 0), (5, 2, 0),
    (5, 2, 1), (5, 2, 2), (8, 3, 0), (11, 4, 0), (3, 1, 0), (3, 1, 1),
)  # fmt: skip


@dataclass(frozen=True, order=True)
class Factor:
    """x^poly · log2(x)^log of parameter number `parameter`; `saturating` makes it (x−1)/x instead."""

    parameter: int
    poly: Fraction = Fraction(0)
    log: int = 0
    saturating: bool = False

    def evaluate(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if self.saturating:
            return (x - 1.0) / x
        value = np.power(x, float(self.poly)) if self.poly else np.ones_like(x)
        if self.log:  # a negative log exponent (Extra-P's mirrored set) divides by log2(x)
            value = value * np.power(np.log2(x), self.log)
        return value

    def text(self, name: str) -> str:
        if self.saturating:
            return f"({name}-1)/{name}"
        parts = []
        if self.poly:
            parts.append(
                name
                if self.poly == 1
                else f"{name}^({self.poly})"
                if self.poly.denominator > 1
                else f"{name}^{self.poly}"
            )
        if self.log:
            parts.append(f"log2({name})" if self.log == 1 else f"log2({name})^{self.log}")
        return "·".join(parts) or "1"


Term = tuple[Factor, ...]


def evaluate_term(term: Term, x: np.ndarray) -> np.ndarray:
    """A term's value at each row of x (points × parameters)."""
    x = np.atleast_2d(np.asarray(x, dtype=float))
    value = np.ones(x.shape[0])
    for factor in term:
        value = value * factor.evaluate(x[:, factor.parameter])
    return value


def term_text(term: Term, names: tuple[str, ...]) -> str:
    return "·".join(factor.text(names[factor.parameter]) for factor in term)


def extrap_building_blocks(parameter: int = 0, *, logs: bool = True, negative: bool = False) -> list[Factor]:
    """Extra-P's default set for one parameter, in its order: 42 factors, the 19 without a log when `logs`
    is False; `negative` appends each mirrored, x^(−i/j)·log2(x)^(−k), as its allow_negative_exponents."""
    return list(_building_blocks(parameter, logs, negative))


@functools.cache
def _building_blocks(parameter: int, logs: bool, negative: bool) -> tuple[Factor, ...]:
    chosen = [(i, j, k) for i, j, k in EXTRAP_EXPONENTS if logs or k == 0]
    blocks = [Factor(parameter, Fraction(i, j), k) for i, j, k in chosen]
    if negative:
        blocks += [Factor(parameter, -Fraction(i, j), -k) for i, j, k in chosen]
    return tuple(blocks)
