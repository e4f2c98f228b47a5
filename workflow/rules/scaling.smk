# Empirical scaling models (Extra-P's normal form) of the measured figures, with their bands and where
# they extrapolate to (the sweep's `scaling` key); the report draws them beside the measured points.


rule fit_scaling:
    input:
        table=rules.aggregate.output.parquet,
    output:
        models=SCALING_MODELS,
    log:
        f"{SWEEP_DIR}/logs/fit_scaling.log",
    params:
        sweep=CONFIG_JSON,
    localrule: True
    conda:
        "../../envs/report.yaml"
    shell:
        "ddlbench fit --config-json {params.sweep:q} --table {input.table:q} --allow-none --format json --out {output.models:q} > {log:q} 2>&1"
