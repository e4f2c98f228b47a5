"""Sparse sampling and the adaptive sweep (Extra-Deep's idea): measure few points, each for few steps,
model them, and measure next where the model is least sure per unit of cost (settings.py → plan.py →
summary.py; the loop itself is workflow/adaptive.smk)."""
