# Each point's record: one run_point job per point, locally or as a SLURM job (--profile slurm). Inside an
# allocation with DDLBENCH_PACK=1 (PREPARED.packed) one job instead hands every point without a record to
# the packed dispatcher, which plans them into the allocation and runs each as a job step on nodes of its
# own (ddlbench.launch.inside); exit status 3 (some point left unrun, its record says why) is no failure.

if not PREPARED.packed:

    rule run_point:
        output:
            record=RECORD,
        log:
            f"{SWEEP_DIR}/logs/run_point/{{point}}.log",
        params:
            spec=point_spec,
        threads: point_threads
        priority: point_priority
        resources:
            **POINT_RESOURCES,
        conda:
            "../../envs/compute.yaml"
        shell:
            "ddlbench run-point --spec {params.spec:q} --out {output.record:q} --cores {threads} > {log:q} 2>&1"

elif INSIDE.output:

    rule run_inside_allocation:
        output:
            INSIDE.output,
        log:
            INSIDE.log,
        params:
            sweep=CONFIG_JSON,
        threads: 1
        localrule: True
        conda:
            "../../envs/compute.yaml"
        shell:
            "ddlbench run-packed --config-json {params.sweep:q} --out {output:q} > {log:q} 2>&1 || test $? -eq 3"
