# ddlbench's adaptive sweep (sparse sampling): a checkpoint loop over rounds instead of every point.
#   snakemake -s workflow/adaptive.smk --cores 2 --configfile my-sweep.yaml   # its `adaptive:` key
#   snakemake -s workflow/adaptive.smk --profile slurm --configfile my-sweep.yaml  # points as SLURM jobs
# Round N (checkpoint choose_round) reads the records of rounds < N, models them and writes which short
# runs to measure next, or why to stop (ddlbench.sampling.plan); they are measured in launches of several
# points each (ddlbench.launch.group: a launch's fixed cost paid once), each point with its own record;
# the loop goes on until a round stops; then the summary: cost, savings and models (ddlbench.sampling.summary).
# Everything lands in <results_dir>/<name>/adaptive/.

# The preamble (rules/preamble.smk) validates the sweep and its `adaptive:` key, and makes the checks
# every workflow makes, on the full plan: a sampled point has its configuration's ranks, threads and
# allocation there. `--profile slurm` names its site file: each launch is then a SLURM job.
WORKFLOW_KIND = "adaptive"


include: "rules/preamble.smk"
include: "rules/sampling.smk"


rule all:
    input:
        f"{FOLDER}/sampling.json",


checkpoint choose_round:
    input:
        previous_round,
    output:
        plan=f"{FOLDER}/rounds/{{round}}.json",
    log:
        f"{FOLDER}/logs/round_{{round}}.log",
    params:
        sweep=CONFIG_JSON,
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "ddlbench sample --config-json {params.sweep:q} --round {wildcards.round} --out {output.plan:q} > {log:q} 2>&1"


rule sampled_launch:
    output:
        launch=f"{FOLDER}/launches/{{launch}}.json",
    log:
        f"{FOLDER}/logs/{{launch}}.log",
    params:
        specs=launch_specs,
        records=f"{FOLDER}/points",
    threads: launch_threads
    resources:
        **LAUNCH_RESOURCES,
    conda:
        "../envs/compute.yaml"
    shell:
        "ddlbench run-group --specs {params.specs:q} --records-dir {params.records:q} --out {output.launch:q} "
        "--launch-id {wildcards.launch:q} --cores {threads} > {log:q} 2>&1"


rule summary:
    input:
        every_round,
    output:
        summary=f"{FOLDER}/sampling.json",
    log:
        f"{FOLDER}/logs/summary.log",
    params:
        sweep=CONFIG_JSON,
    localrule: True
    conda:
        "../envs/report.yaml"
    shell:
        "ddlbench sample --config-json {params.sweep:q} --summarize --out {output.summary:q} > {log:q} 2>&1"
