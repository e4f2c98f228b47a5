# Predict before measuring: the analytical model's figures of every point, on the sweep's machine file
# (`machine:`) or on one measured here first (`calibrate:`, a calibration suite). The report reads them.

if CALIBRATE_SUITE:

    rule calibrate_machine:
        input:
            suite=CALIBRATE_SUITE,
        output:
            machine=MACHINE_FILE,
        log:
            f"{SWEEP_DIR}/logs/calibrate_machine.log",
        threads: CALIBRATE_CORES
        conda:
            "../../envs/compute.yaml"
        shell:
            "ddlbench calibrate --configfile {input.suite:q} --out {output.machine:q} --cores {threads} > {log:q} 2>&1"


if MACHINE_FILE:

    rule predict:
        input:
            machine=MACHINE_FILE,
        output:
            csv=PREDICTIONS,
        log:
            f"{SWEEP_DIR}/logs/predict.log",
        params:
            sweep=CONFIG_JSON,
        localrule: True
        conda:
            "../../envs/compute.yaml"
        shell:
            "ddlbench predict --config-json {params.sweep:q} --machine {input.machine:q} --format csv --out {output.csv:q} > {log:q} 2>&1"
