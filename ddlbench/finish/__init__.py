"""Finishing a sweep: the one road from its records to every result (ddlbench.finish.sweep)."""

from ddlbench.finish.sweep import Finished, finish_sweep

__all__ = ["Finished", "finish_sweep"]
