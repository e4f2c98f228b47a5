#!/usr/bin/env python3
"""Reference oracle: model one data set with the real Extra-P and print the selection as JSON.

Runs INSIDE the Extra-P venv made by `envs/extrap.sh VENV` (imports only extrap, numpy and the
standard library), e.g. `VENV/bin/python envs/extrap_driver.py < request.json`.

Request (stdin, JSON), or a JSON list of such requests (answered by a list, in one process):
    {"parameters": ["p"] | ["p", "b"],            # 1 to 4 names, no whitespace
     "points": [[x1] | [x1, x2], ...],            # one coordinate per measurement point, no duplicates
     "values": [[rep1, rep2, ...], ...],          # the repetitions measured at each point
     "predict_at": [[x] | [x1, x2], ...],         # optional
     "options": {...}}                            # optional, see below

Options (all optional; leaving them out gives exactly what `extrap --text FILE` selects):
    "modeler": Extra-P modeler name ("default"; e.g. "basic", "refining", "multi-parameter")
    "measure": "mean" (default, as the CLI) | "median" | "minimum" | "maximum": the statistic of the
               repetitions that is modeled (unlike the 4.2.5 CLI, whose --median is ignored for one parameter)
    "single_parameter_modeler": for multi-parameter experiments, the single-parameter modeler to use
    "single_parameter_options": {option: value} set on the multi-parameter modeler's single-parameter modeler
    any other key: a modeler option set on the modeler itself (as `extrap --options KEY=VALUE`),
                   e.g. "use_crossvalidation", "allow_negative_exponents", "allow_log_terms"

The data goes through a temporary file in Extra-P's text format read by its TextFileReader, then
ModelGenerator(...).model_all(): the same path as `extrap --text FILE` (values are written with
repr(), which round-trips every float exactly).

Reply (stdout, JSON): extrap_version, modeler, measure, function (Extra-P's own to_string, as the
CLI prints it), constant, terms [{coefficient, factors: [{parameter, exponent_poly, exponent_log}]}],
smape, rss, rrss, nrss, re, ar2 (Extra-P's costs of the selected hypothesis: for a one-parameter
PMNF model with cross-validation, the leave-one-out costs it compared (rss = sum of squared LOO errors,
smape = mean LOO SMAPE in %); for the constant model and multi-parameter models, costs over all points;
nrss is not computed for multi-parameter models and reads 0), hypothesis (its class name),
warnings (what Extra-P warned about, e.g. dropped log terms) and predictions (at predict_at).
Non-finite numbers are written as null. Errors: a message on stderr and exit status 1 (2 for a bad request).
"""

import contextlib
import json
import math
import os
import sys
import tempfile
import warnings


def _fail(message, code=1):
    print(f"extrap_driver: error: {message}", file=sys.stderr)
    sys.exit(code)


def _num(x):
    x = float(x)
    return x if math.isfinite(x) else None


def _read_requests():
    """The request, or a list of them (answered in one process: Extra-P's imports take seconds)."""
    try:
        req = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        _fail(f"stdin is not JSON: {e}", 2)
    if isinstance(req, list):
        return [_parse(one) for one in req], True
    return [_parse(req)], False


def _parse(req):
    if not isinstance(req, dict):
        _fail("the request must be a JSON object", 2)
    params = req.get("parameters")
    points = req.get("points")
    values = req.get("values")
    predict_at = req.get("predict_at") or []
    options = dict(req.get("options") or {})
    if not (
        isinstance(params, list)
        and 1 <= len(params) <= 4
        and all(isinstance(p, str) and p and not any(c.isspace() for c in p) for p in params)
    ):
        _fail("'parameters' must be a list of 1 to 4 names without whitespace", 2)
    if len(set(params)) != len(params):
        _fail("'parameters' has duplicate names", 2)
    if not isinstance(points, list) or not isinstance(values, list) or len(points) != len(values) or not points:
        _fail("'points' and 'values' must be non-empty lists of the same length", 2)
    d = len(params)

    def coord(pt, what):
        if not isinstance(pt, list) or len(pt) != d:
            _fail(f"each of '{what}' must be a list of {d} number(s), got {pt!r}", 2)
        try:
            return tuple(float(v) for v in pt)
        except (TypeError, ValueError):
            _fail(f"non-numeric coordinate in '{what}': {pt!r}", 2)

    coords = [coord(pt, "points") for pt in points]
    if len(set(coords)) != len(coords):
        _fail("'points' has duplicate coordinates (give all repetitions of a point in one 'values' list)", 2)
    reps = []
    for pt, vs in zip(points, values, strict=True):
        if not isinstance(vs, list) or not vs:
            _fail(f"'values' for point {pt!r} must be a non-empty list of repetitions", 2)
        try:
            reps.append([float(v) for v in vs])
        except (TypeError, ValueError):
            _fail(f"non-numeric value for point {pt!r}", 2)
        if not all(math.isfinite(v) for v in reps[-1]):
            _fail(f"non-finite value for point {pt!r}", 2)
    preds = [coord(pt, "predict_at") for pt in predict_at]
    return params, coords, reps, preds, options


def _write_text_file(path, params, coords, reps):
    # Extra-P's text input format (extrap/fileio/file_reader/text_file_reader.py).
    with open(path, "w") as f:
        f.write("PARAMETER " + " ".join(params) + "\n")
        if len(params) == 1:
            f.write("POINTS " + " ".join(repr(c[0]) for c in coords) + "\n")
        else:
            f.write("POINTS " + " ".join("(" + " ".join(repr(v) for v in c) + ")" for c in coords) + "\n")
        f.write("REGION reg\nMETRIC metric\n")
        for vs in reps:
            f.write("DATA " + " ".join(repr(v) for v in vs) + "\n")


def _factors(compound_term, parameter):
    """Collapse a CompoundTerm's simple terms into one {parameter, exponent_poly, exponent_log}."""
    if type(compound_term).__name__ != "CompoundTerm":
        raise TypeError(f"unsupported term type {type(compound_term).__name__} (segmented models are not exported)")
    poly = log = 0.0
    for t in compound_term.simple_terms:
        if t.term_type == "polynomial":
            poly += float(t.exponent)
        elif t.term_type == "logarithm":
            log += float(t.exponent)
        else:
            raise TypeError(f"unknown simple term type {t.term_type!r}")
    return {"parameter": parameter, "exponent_poly": poly, "exponent_log": log}


def _terms(function, params):
    from extrap.entities.functions import ConstantFunction, MultiParameterFunction, SingleParameterFunction
    from extrap.entities.terms import MultiParameterTerm

    if isinstance(function, ConstantFunction):
        return []
    out = []
    if isinstance(function, MultiParameterFunction):
        for term in function.compound_terms:
            if not isinstance(term, MultiParameterTerm):
                raise TypeError(f"unexpected term {term!r}")
            coefficient = float(term.coefficient)
            factors = []
            for index, ct in term.parameter_term_pairs:
                coefficient *= float(ct.coefficient)  # 1 after reset_coefficients(); kept for exactness
                factors.append(_factors(ct, params[index]))
            out.append({"coefficient": coefficient, "factors": factors})
    elif isinstance(function, SingleParameterFunction):
        for ct in function.compound_terms:
            out.append({"coefficient": float(ct.coefficient), "factors": [_factors(ct, params[0])]})
    else:
        raise TypeError(f"unsupported function type {type(function).__name__}")
    return out


def _configure(generator, options):
    from extrap.modelers import single_parameter
    from extrap.modelers.abstract_modeler import MultiParameterModeler

    modeler = generator.modeler
    sp_name = options.pop("single_parameter_modeler", None)
    sp_opts = options.pop("single_parameter_options", None) or {}
    if isinstance(modeler, MultiParameterModeler):
        if sp_name is not None:
            modeler.single_parameter_modeler = single_parameter.all_modelers[sp_name]()
            modeler.single_parameter_modeler.use_measure = modeler.use_measure
        for name, value in sp_opts.items():
            if not hasattr(modeler.single_parameter_modeler, name):
                _fail(f"the single-parameter modeler has no option {name!r}", 2)
            setattr(modeler.single_parameter_modeler, name, value)
    elif sp_name is not None or sp_opts:
        _fail("'single_parameter_modeler'/'single_parameter_options' apply to multi-parameter experiments only", 2)
    for name, value in options.items():
        if not hasattr(modeler, name):
            _fail(f"modeler {modeler.NAME!r} has no option {name!r}", 2)
        setattr(modeler, name, value)


def main():
    requests, several = _read_requests()
    replies = [_model(*request) for request in requests]
    json.dump(replies if several else replies[0], sys.stdout)
    sys.stdout.write("\n")


def _model(params, coords, reps, preds, options):
    import extrap
    import numpy
    from extrap.entities.measurement import Measure
    from extrap.fileio.file_reader.text_file_reader import TextFileReader
    from extrap.modelers.model_generator import ModelGenerator

    modeler_name = str(options.pop("modeler", "default")).lower()
    measure_name = str(options.pop("measure", "mean"))
    try:
        measure = Measure.from_str(measure_name)
    except KeyError:
        _fail(f"unknown measure {measure_name!r}", 2)

    # Anything Extra-P prints goes to stderr: stdout carries only the JSON reply.
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("always")
        with tempfile.TemporaryDirectory(prefix="extrap-driver-") as tmp:
            path = os.path.join(tmp, "data.txt")
            _write_text_file(path, params, coords, reps)
            experiment = TextFileReader().read_experiment(path)
        try:
            generator = ModelGenerator(experiment, modeler=modeler_name, use_measure=measure)
        except ValueError as e:
            _fail(str(e), 2)
        # Extra-P 4.2.5's ModelGenerator applies use_measure only to multi-parameter modelers chosen by
        # name, so `extrap --text F --median` still models the mean of one-parameter data; set it here.
        generator.modeler.use_measure = measure
        _configure(generator, options)
        generator.model_all()
        (model,) = generator.models.values()
        hypothesis = model.hypothesis
        function = hypothesis.function
        if preds:
            predictions = numpy.asarray(function.evaluate(numpy.array(preds, dtype=float).T), dtype=float)
            predictions = numpy.broadcast_to(predictions, (len(preds),))
        else:
            predictions = []

    reply = {
        "extrap_version": extrap.__version__,
        "modeler": generator.modeler.NAME,
        "measure": measure.name.lower(),
        "function": function.to_string(*experiment.parameters),
        "constant": _num(function.constant_coefficient),
        "terms": _terms(function, params),
        "hypothesis": type(hypothesis).__name__,
        "smape": _num(hypothesis.SMAPE),
        "rss": _num(hypothesis.RSS),
        "rrss": _num(hypothesis.rRSS),
        "nrss": _num(hypothesis.nRSS),
        "re": _num(hypothesis.RE),
        "ar2": _num(hypothesis.AR2),
        "predictions": [_num(v) for v in predictions],
        "warnings": sorted(
            {
                str(w.message)
                for w in caught
                if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))
            }
        ),
    }
    return reply


if __name__ == "__main__":
    main()
