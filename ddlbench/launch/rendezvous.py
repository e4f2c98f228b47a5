"""Who a rank is and where ranks meet, from the environment its launcher gave it.

Local launches set torchrun-style variables (RANK, WORLD_SIZE, ...); srun sets SLURM_PROCID and
friends. Both end as one RankEnv, so the worker does not care which launcher started it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddlbench.errors import DdlbenchError

INIT_METHOD_VAR = "DDLBENCH_INIT_METHOD"


@dataclass(frozen=True, kw_only=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    init_method: str  # torch.distributed init_method: file://... (one host) or tcp://host:port


def rank_env(environ: Mapping[str, str]) -> RankEnv:
    """Read a rank's identity from torchrun-style variables, else from srun's SLURM_* variables."""
    if "RANK" in environ:
        keys = {
            "rank": "RANK",
            "world_size": "WORLD_SIZE",
            "local_rank": "LOCAL_RANK",
            "node_rank": "NODE_RANK",
        }
    elif "SLURM_PROCID" in environ:
        keys = {
            "rank": "SLURM_PROCID",
            "world_size": "SLURM_NTASKS",
            "local_rank": "SLURM_LOCALID",
            "node_rank": "SLURM_NODEID",
        }
    else:
        raise DdlbenchError("no rank in the environment: neither RANK (local launch) nor SLURM_PROCID (srun) is set")
    try:
        values = {field: int(environ[var]) for field, var in keys.items()}
    except KeyError as missing:
        raise DdlbenchError(f"rank environment incomplete: {missing.args[0]} is not set") from None
    init_method = environ.get(INIT_METHOD_VAR)
    if not init_method:
        if "MASTER_ADDR" not in environ or "MASTER_PORT" not in environ:
            raise DdlbenchError(f"no rendezvous: set {INIT_METHOD_VAR}, or MASTER_ADDR and MASTER_PORT")
        init_method = f"tcp://{environ['MASTER_ADDR']}:{environ['MASTER_PORT']}"
    return RankEnv(**values, init_method=init_method)


def slurm_master_port(job_id: str, *, base: int = 20000, span: int = 20000) -> int:
    """A port that every rank of a job derives alike and that differs between concurrent jobs."""
    return base + int(job_id) % span
