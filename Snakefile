# ddlbench: one sweep = one DAG. Table of contents only; the package decides what is in each file.
#   snakemake --cores 2                              # the embedded default sweep
#   snakemake --cores 2 --configfile my-sweep.yaml   # any sweep file, validated before anything runs

#   snakemake --profile slurm                       # on a SLURM login node, after `ddlbench profile slurm`

# The profile `slurm` passes its site file as config key slurm_site; the rest of config is the sweep.
SITE_FILE = config.pop("slurm_site", None)

# A --configfile replaces the default instead of being merged into it: a merged sweep would keep
# axes and exclusions the user never wrote.
if not config:

    configfile: "workflow/config/default.yaml"

    config.pop("slurm_site", None)  # Snakemake applies --config again over a configfile


include: "workflow/rules/common.smk"


# The records are asked for directly too: Snakemake would not otherwise notice a deleted record
# (an intermediate file) while the report is up to date, and deleting one is how a point is rerun.
rule all:
    input:
        REPORT,
        RECORDS,


include: "workflow/rules/points.smk"
include: "workflow/rules/predict.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/scaling.smk"
