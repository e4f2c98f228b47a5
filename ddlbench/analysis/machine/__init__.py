"""The machine file, from a calibration's records: its model (`machine_file`: read, checked, written), the
α–β fits of collectives (`fit`), the layer timings of models (`layer_timings`) and the operators' timings
(`operator_timings`). Torch-free: machine files are fitted and read on a login node, by the analytical
model (ddlbench.analysis.analytic) and by certification.
"""
