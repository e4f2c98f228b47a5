# ddlbench: one sweep = one DAG. Table of contents only; the package decides what is in each file.
#   snakemake --cores 2                              # the embedded default sweep
#   snakemake --cores 2 --configfile my-sweep.yaml   # any sweep file, validated before anything runs

#   snakemake --profile slurm                       # on a SLURM login node, after `ddlbench profile slurm`

# What this workflow plans (workflow/rules/preamble.smk): the sweep of --configfile, else the default one;
# the preamble validates it and makes the checks every workflow makes before anything is scheduled.
WORKFLOW_KIND = "sweep"


include: "workflow/rules/preamble.smk"
include: "workflow/rules/common.smk"


# A deleted record is asked for by name (workflow/rules/common.smk): Snakemake would not otherwise
# notice it while the report is up to date, and deleting one is how a point is run again.
rule all:
    input:
        REPORT,
        RECORDS_TO_NAME,


include: "workflow/rules/points.smk"
include: "workflow/rules/predict.smk"
include: "workflow/rules/report.smk"
