"""`ddlbench profile slurm`: the site's settings, and a Snakemake profile named `slurm` that uses them.

The profile goes where Snakemake looks up named profiles ($XDG_CONFIG_HOME/snakemake/slurm, by
default ~/.config/snakemake/slurm), so `snakemake --profile slurm` works from the repository root.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from ddlbench.atomic import write_text_atomic
from ddlbench.errors import DdlbenchError
from ddlbench.launch.limits import Limit
from ddlbench.launch.resources import Site, load_site
from ddlbench.provenance import utc_now
from ddlbench.templating import template_environment

PROFILE_NAME = "slurm"
SITE_FILE_NAME = "ddlbench-site.yaml"
MARKER = "written by `ddlbench profile slurm`"
STATUS_COMMANDS = ("sacct", "squeue")


def default_profile_dir() -> Path:
    """Snakemake's user profile folder for the name `slurm` (platformdirs' rule on Linux)."""
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "snakemake" / PROFILE_NAME


def default_site_file() -> Path:
    return default_profile_dir() / SITE_FILE_NAME


def load_default_site() -> Site:
    path = default_site_file()
    if not path.exists():
        raise DdlbenchError(
            f"no site settings at {path}; run `ddlbench profile slurm --partition NAME` once, or pass --site"
        )
    return load_site(path)


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    jobs: int = 100
    status_wait_s: int = 20  # the plugin polls this long after a job ended, +10 s a poll while none does
    latency_wait_s: int = 30
    # squeue, not the plugin's default sacct: plugin 2.8.0 reads sacct's "CANCELLED by <uid>" as still
    # running, so a job cancelled with scancel would keep Snakemake waiting forever (seen on the test
    # cluster). squeue says CANCELLED, and keeps ended jobs for MinJobAge (the plugin checks it).
    status_command: str | None = "squeue"
    # the tightest of the user's submit limits, read when the profile is written (ddlbench.launch.limits):
    # `jobs` is held under it, since Snakemake's plugin counts a job sbatch refuses as failed
    queue_limit: Limit | None = None


def write_profile(site: Site, options: ProfileOptions, *, directory: Path | None = None, force: bool = False) -> Path:
    """Write the site file and the profile's config.yaml into `directory`; returns the config path.

    A config.yaml that ddlbench did not write is another workflow's profile: it is left alone unless
    `force` is given."""
    directory = directory or default_profile_dir()
    config = directory / "config.yaml"
    if config.exists() and MARKER not in config.read_text() and not force:
        raise DdlbenchError(f"{config} exists and was not written by ddlbench; pass --force to replace it")
    if options.status_command is not None and options.status_command not in STATUS_COMMANDS:
        raise DdlbenchError(
            f"status command {options.status_command!r} is not accepted; choose from: {', '.join(STATUS_COMMANDS)}"
        )
    for name, value in (("jobs", options.jobs), ("status wait", options.status_wait_s)):
        if value < 1:
            raise DdlbenchError(f"{name} {value} is not accepted; give an integer >= 1")
    jobs, limit = options.jobs, options.queue_limit
    if limit is not None and limit.value < jobs:
        jobs = max(1, limit.value)
    directory.mkdir(parents=True, exist_ok=True)
    site_file = directory / SITE_FILE_NAME
    write_text_atomic(site_file, f"# {MARKER}\n" + yaml.safe_dump(site.to_dict(), sort_keys=True))
    text = (
        template_environment(autoescape=False)
        .get_template("slurm-profile/config.yaml.j2")
        .render(
            site=site,
            site_file=str(site_file.resolve()),
            jobs=jobs,
            requested_jobs=options.jobs,
            queue_limit=limit,
            status_wait=options.status_wait_s,
            latency_wait=options.latency_wait_s,
            status_command=options.status_command,
            written=utc_now(),
        )
    )
    yaml.safe_load(text)  # a template bug must not leave a profile Snakemake cannot read
    write_text_atomic(config, text)
    return config
