"""Where a rank runs, as the site decides it: one GPU per rank bound by SLURM, and the network settings
NCCL and gloo read. Torch-free: the launchers (and the login node) import it; the rank's side is
ddlbench.launch.devices.

The site file (`ddlbench profile slurm`, ddlbench.launch.resources.Site) says

- `gpu_bind`: how the ranks' srun step binds GPUs to tasks when the site asks for GPUs (gpus_per_rank
  1): the step gets `--gpus-per-task=1 --gpu-bind=<gpu_bind>`, so each task sees its own GPU
  (CUDA_VISIBLE_DEVICES one entry) and the rank takes cuda:0. `single:1` by default, not `closest`:
  closest binds a task to every GPU of its NUMA domain (several on a node with 4 GPUs a socket), and to
  every GPU of the step where SLURM knows no GPU-to-CPU affinity (gres.conf without Cores, or task/none:
  measured on the test cluster, Slurm 22.05, each of 2 tasks saw "0,1"); single:1 is closest's choice
  narrowed to one GPU a task. per_task:1 (what --gpus-per-task implies alone) ignores locality;
  map_gpu:/mask_gpu: name the GPUs; none leaves CUDA_VISIBLE_DEVICES unset, so every task sees all of
  its node's GPUs and local rank r takes cuda:r.
- `network_env`: NCCL, gloo and fabric variables (NETWORK_ENV_NAMES only) that every launcher puts into
  its ranks' environment (never through a shell), and that each rank records as it saw them.

What the site says travels to the jobs in LAUNCH_VAR (JSON, exported by sbatch like the partition's memory
defaults): set by whoever reads the site file (ddlbench.launch.submission.plan_resources, `run-packed` in
an allocation, `run-point --site`), read by the launchers.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddlbench.errors import ConfigError, DdlbenchError

LAUNCH_VAR = "DDLBENCH_LAUNCH_SETTINGS"
# set by the srun launcher in the ranks' environment when it bound GPUs to tasks: the --gpu-bind it gave
GPU_BIND_VAR = "DDLBENCH_GPU_BIND"
DEFAULT_GPU_BIND = "single:1"
GPU_BIND_FORMS = ("closest", "single:N", "per_task:N", "map_gpu:LIST", "mask_gpu:LIST", "none")
_GPU_BIND = re.compile(
    r"(?:verbose,)?(?:closest|none|(?:single|per_task):[1-9][0-9]*"
    r"|map_gpu:[0-9]+(?:\*[1-9][0-9]*)?(?:,[0-9]+(?:\*[1-9][0-9]*)?)*"
    r"|mask_gpu:(?:0x)?[0-9A-Fa-f]+(?:\*[1-9][0-9]*)?(?:,(?:0x)?[0-9A-Fa-f]+(?:\*[1-9][0-9]*)?)*)"
)

# the variables a site may set for its ranks: interfaces, fabrics and transports of NCCL, gloo, TensorPipe,
# libfabric and UCX, and NCCL's logging; nothing that changes what a rank computes
NETWORK_ENV_NAMES = (
    "NCCL_SOCKET_IFNAME",
    "NCCL_SOCKET_FAMILY",
    "NCCL_SOCKET_NTHREADS",
    "NCCL_NSOCKS_PERTHREAD",
    "NCCL_IB_DISABLE",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_IB_TC",
    "NCCL_IB_SL",
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT",
    "NCCL_NET",
    "NCCL_NET_PLUGIN",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ",
    "NCCL_CROSS_NIC",
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_SHM_DISABLE",
    "NCCL_TOPO_FILE",
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "GLOO_SOCKET_IFNAME",
    "GLOO_DEVICE_TRANSPORT",
    "TP_SOCKET_IFNAME",
    "FI_PROVIDER",
    "FI_EFA_USE_DEVICE_RDMA",
    "UCX_NET_DEVICES",
    "UCX_TLS",
)
_NAMES = frozenset(NETWORK_ENV_NAMES)


def check_gpu_bind(value: object, *, key: str = "gpu_bind") -> str:
    """A site's gpu_bind, as srun's --gpu-bind takes it; ConfigError naming the key and the accepted forms."""
    if not isinstance(value, str) or not _GPU_BIND.fullmatch(value):
        raise ConfigError(
            key,
            f"{value!r} is not accepted; choose one of {', '.join(GPU_BIND_FORMS)} (srun's --gpu-bind, e.g. "
            "single:1 or map_gpu:0,1; N an integer >= 1, LIST comma-separated GPU indices or hex masks)",
        )
    return value


def check_network_env(raw: object, *, key: str = "network_env") -> dict[str, str]:
    """A site's network_env: a mapping of accepted names to values (strings, or integers written as such),
    each value one line without NUL; ConfigError naming the key and what is accepted."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(key, f"{raw!r} is not a mapping of variable names to values, e.g. {{NCCL_IB_DISABLE: 1}}")
    checked: dict[str, str] = {}
    for name, value in raw.items():
        if name not in _NAMES:
            accepted = ", ".join(NETWORK_ENV_NAMES)
            raise ConfigError(
                f"{key}.{name}", f"{name!r} is not a network variable ddlbench sets; accepted: {accepted}"
            )
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ConfigError(f"{key}.{name}", f"{value!r} is not accepted; give a string or an integer")
        text = str(value)
        if not text or any(char in text for char in "\0\n\r"):
            raise ConfigError(f"{key}.{name}", f"{text!r} is not accepted; give a non-empty value on one line")
        checked[name] = text
    return dict(sorted(checked.items()))


@dataclass(frozen=True, kw_only=True)
class LaunchSettings:
    """What the site says about placing ranks: GPUs per rank, how srun binds them, the network variables."""

    gpus_per_rank: int = 0
    gpu_bind: str = DEFAULT_GPU_BIND
    network_env: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> str:
        data = {"gpus_per_rank": self.gpus_per_rank, "gpu_bind": self.gpu_bind, "network_env": dict(self.network_env)}
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def srun_options(self) -> list[str]:
        """The GPU options of the ranks' srun step: none without GPUs, else one GPU per task, bound."""
        if self.gpus_per_rank < 1:
            return []
        return [f"--gpus-per-task={self.gpus_per_rank}", f"--gpu-bind={self.gpu_bind}"]

    def rank_env(self) -> dict[str, str]:
        """The network variables every launcher adds to its ranks' environment."""
        return dict(self.network_env)


def settings_of(site: Any) -> LaunchSettings:
    """The launch settings of a site (ddlbench.launch.resources.Site, validated)."""
    return LaunchSettings(
        gpus_per_rank=site.gpus_per_rank,
        gpu_bind=site.gpu_bind,
        network_env=tuple(sorted(dict(site.network_env).items())),
    )


def pass_on(site: Any) -> None:
    """Give this process and every process and job it starts the site's launch settings (sbatch exports
    the environment, as it does the site's patience)."""
    os.environ[LAUNCH_VAR] = settings_of(site).to_json()


def launch_settings(environ: Mapping[str, str]) -> LaunchSettings:
    """The launch settings passed on in `environ` (LAUNCH_VAR); the defaults (no GPU options, no network
    variables) where none were. Checked again here: the variable may have been written by hand."""
    text = environ.get(LAUNCH_VAR, "").strip()
    if not text:
        return LaunchSettings()
    try:
        data = json.loads(text)
        gpus = data.get("gpus_per_rank", 0)
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise ConfigError("gpus_per_rank", f"{gpus!r} is not accepted; give an integer >= 0")
        return LaunchSettings(
            gpus_per_rank=gpus,
            gpu_bind=check_gpu_bind(data.get("gpu_bind", DEFAULT_GPU_BIND)),
            network_env=tuple(check_network_env(data.get("network_env")).items()),
        )
    except (json.JSONDecodeError, AttributeError, ConfigError) as exc:
        raise DdlbenchError(f"{LAUNCH_VAR} is not the launch settings of a site: {exc}") from None


def network_env_seen(environ: Mapping[str, str]) -> dict[str, str]:
    """The network variables (NETWORK_ENV_NAMES) of `environ`: what a rank records as it saw them, whoever
    set them (the site, or the user's own environment)."""
    return {name: environ[name] for name in NETWORK_ENV_NAMES if name in environ}
