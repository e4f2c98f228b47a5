"""ddlbench: sweeps of distributed deep-learning benchmarks, from config to HTML report."""

__version__ = "0.1.0"
