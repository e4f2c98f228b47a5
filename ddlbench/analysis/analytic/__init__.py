"""The analytical model: per-layer facts of a model, a machine's rates and costs, and what they predict."""
