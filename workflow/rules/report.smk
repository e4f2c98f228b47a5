# The sweep's results from its records, in one step: the table, the predictions (where the sweep knows
# its machine), the scaling models, the sweep in the results database, and the report. The same function
# finishes a sweep for `ddlbench submit`, `rerun` and `certify` (ddlbench.finish), so every road makes the
# same files from the same records.


rule report:
    input:
        REPORT_INPUTS,
        MACHINE_FILE or [],
    output:
        FINISHED,
    log:
        f"{SWEEP_DIR}/logs/report.log",
    params:
        sweep=CONFIG_JSON,
    localrule: True
    conda:
        "../../envs/compute.yaml" if MACHINE_FILE else "../../envs/report.yaml"
    shell:
        "ddlbench report --config-json {params.sweep:q} > {log:q} 2>&1"
