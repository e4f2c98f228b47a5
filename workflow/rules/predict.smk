# Predict before measuring: a sweep without a machine file (`machine:`) measures one here first from its
# calibration suite (`calibrate:`); the report rule (report.smk) then predicts every point on it.

if CALIBRATE_SUITE:

    rule calibrate_machine:
        input:
            suite=CALIBRATE_SUITE,
        output:
            machine=MACHINE_FILE,
        log:
            f"{SWEEP_DIR}/logs/calibrate_machine.log",
        threads: CALIBRATE_CORES
        resources:
            # on SLURM, where the sweep's points run: their partition, GPUs and memory (preflight)
            **CALIBRATE_RESOURCES,
        conda:
            "../../envs/compute.yaml"
        shell:
            "ddlbench calibrate --configfile {input.suite:q} --out {output.machine:q} --cores {threads} > {log:q} 2>&1"
