"""Empirical performance models of a sweep's figures over scale (Extra-P's normal form, Extra-Deep's use).

terms.py (the building blocks and their notation) → regression.py (a linear least-squares fit of one
hypothesis, with its band) → search.py (which hypothesis: Extra-P's rules, and ddlbench's for
extrapolation) → series.py (a sweep's records or a CSV as series to model) → cheapest.py, sampling.py.
Numpy only; no torch.
"""
