"""Model builders; the registry with their facts is ddlbench.catalog.MODELS."""
