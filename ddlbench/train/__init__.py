"""Per-rank training code; the only layer (with launch.worker) that imports torch."""
