"""The lowest torch release ddlbench trains correctly with, checked in every rank before it starts.

`pyproject.toml` declares the same floor (`torch>=…`, which a test keeps equal to TORCH_FLOOR), and
`make test-floor` runs the tests against exactly that release. A cluster environment can still hold
an older torch (a site module, `pip install --no-deps`): below the floor, a rank refuses to start,
so that no point records figures of a torch known to train wrongly (see TORCH_FLOOR).
"""

from __future__ import annotations

import re

from ddlbench.errors import DdlbenchError

# 2.6: FSDP2 cannot run a step on CPU (its all-gather asks a CPU stream for record_event).
# 2.7, 2.8: FSDP2 over gloo sums gradients instead of averaging them: a 2-rank fully_shard Linear's
# gradient is exactly 2.0x the single-process one, so fsdp and dp_tp miss the reference.
# 2.9: a pipeline's first step sends an int64 scalar into its neighbour's float32 buffer to set up
# the stages' links (PipelineStage._get_init_p2p_neighbors_ops); gloo aborts ("8 vs 4").
TORCH_FLOOR = "2.10.0"


def release(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a torch version string: '2.9.0+cu128', '2.10.0a0+git1234', '2.13.0'."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        raise DdlbenchError(f"cannot read the torch version {version!r}")
    return int(match[1]), int(match[2]), int(match[3] or 0)


def check_torch_floor(version: str) -> None:
    """Refuse a torch below TORCH_FLOOR, naming both and what goes wrong there."""
    if release(version) < release(TORCH_FLOOR):
        raise DdlbenchError(
            f"torch {version} is below ddlbench's floor {TORCH_FLOOR} (pyproject.toml: torch>={TORCH_FLOOR}): "
            "older releases train wrongly or abort on CPU (pipelines on 2.9, FSDP2 on 2.6 to 2.8); "
            f"install torch>={TORCH_FLOOR} for this device"
        )
