rule run_point:
    output:
        record=RECORD,
    log:
        f"{SWEEP_DIR}/logs/run_point/{{point}}.log",
    params:
        spec=point_spec,
    threads: point_threads
    resources:
        **POINT_RESOURCES,
    conda:
        "../../envs/compute.yaml"
    shell:
        "ddlbench run-point --spec {params.spec:q} --out {output.record:q} --cores {threads} > {log:q} 2>&1"
