"""Empirical performance models of a sweep's figures over scale (Extra-P's normal form, Extra-Deep's use).

terms.py (the building blocks and their notation) → regression.py (a linear least-squares fit of one
hypothesis, with its band) → search.py (Extra-P's rules) and laws.py (Amdahl's, forward validation) →
combine.py (the mean of several searches) → candidates.py (the searches the default is chosen among) →
extrapolation.py (ddlbench's default, by kind) and selection.py (that choice, out of sample on public
series) → series.py (a sweep's records or a CSV as series to model) → modelling.py, cheapest.py,
sampling.py. Numpy only; no torch.
"""
