rule aggregate:
    input:
        RECORDS,
    output:
        parquet=TABLE,
        csv=f"{SWEEP_DIR}/table.csv",
    log:
        f"{SWEEP_DIR}/logs/aggregate.log",
    params:
        sweep=CONFIG_JSON,
    localrule: True
    conda:
        "../../envs/report.yaml"
    shell:
        "ddlbench aggregate --config-json {params.sweep:q} --parquet {output.parquet:q} --csv {output.csv:q} > {log:q} 2>&1"


rule report:
    input:
        table=rules.aggregate.output.parquet,
        predictions=PREDICTIONS or [],
        models=SCALING_MODELS,
    output:
        html=REPORT,
        md=f"{SWEEP_DIR}/report.md",
    log:
        f"{SWEEP_DIR}/logs/report.log",
    params:
        sweep=CONFIG_JSON,
    localrule: True
    conda:
        "../../envs/report.yaml"
    shell:
        "ddlbench report --config-json {params.sweep:q} --table {input.table:q} --out {output.html:q} --markdown {output.md:q} > {log:q} 2>&1"
