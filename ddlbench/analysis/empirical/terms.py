"""The terms of the performance-model normal form (PMNF, Calotoiu et al., SC13; Extra-P):

    f(x₁ … x_m) = c₀ + Σ_k c_k · Π_l x_l^{i_kl} · log2(x_l)^{j_kl}

A Factor is one x^i·log2(x)^j of one parameter; a Term is a product of factors (one per parameter it
involves). Exponents are exact fractions so that formulas print as Extra-P's do (x^(3/2)·log2(x)).
Besides Extra-P's monomials, ddlbench's own search may use a *saturating* factor (x−1)/x: the share of a
ring collective's bytes each rank sends, 2(p−1)/p for all-reduce (Thakur, Rabenseifner and Gropp,
IJHPCA 2005), which PMNF can only approximate by a small power.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np


# Extra-P 4.2's default single-parameter building blocks (extrap/modelers/single_parameter/basic.py,
# create_default_building_blocks): 19 polynomial exponents without log, 13 with log2, 10 with log2²
def _fractions(text: str) -> tuple[Fraction, ...]:
    return tuple(Fraction(word) for word in text.split(" "))


POLY_ONLY = _fractions("1/4 1/3 1/2 2/3 3/4 4/5 1 5/4 4/3 3/2 5/3 7/4 2 9/4 7/3 5/2 8/3 11/4 3")
WITH_LOG = _fractions("0 1/4 1/3 1/2 2/3 3/4 1 5/4 4/3 3/2 2 5/2 3")
WITH_LOG2 = _fractions("0 1/4 1/3 1/2 2/3 3/4 1 3/2 2 5/2")


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
        if self.log:
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
    """Extra-P's default set for one parameter: 42 factors (19 without logs when `logs` is False);
    `negative` adds each with its polynomial exponent negated, as Extra-P's allow_negative_exponents."""
    blocks = [Factor(parameter, i, 0) for i in POLY_ONLY]
    if logs:
        blocks += [Factor(parameter, i, 1) for i in WITH_LOG] + [Factor(parameter, i, 2) for i in WITH_LOG2]
    if negative:
        blocks += [Factor(parameter, -f.poly, f.log) for f in blocks if f.poly]
    return blocks
