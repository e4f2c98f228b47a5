#!/usr/bin/env bash
# Create the Extra-P reference venv: `envs/extrap.sh VENV_DIR` (idempotent).
#
# Extra-P (PyPI `extrap`) is only the cross-check oracle for ddlbench's own PMNF search
# (envs/extrap_driver.py runs inside this venv). It pins numpy~=1.18 (<2) and its metadata pulls
# PySide6-Essentials (Qt GUI, ~300 MB) and scikit-learn, so it cannot share ddlbench's venv.
# The modelling path (extrap.modelers.*, extrap.entities.*, TextFileReader, and the `extrap` CLI,
# extrap/extrap/extrapcmd.py) never imports PySide6 or scikit-learn: only the GUI (extrap-gui) and
# extrap.mpa do. So extrap is installed with --no-deps, and then exactly the packages the modelling
# path imports, all pinned: numpy; marshmallow, packaging (entities); matplotlib (util/latex_formatting.py,
# imported by entities/functions.py); tqdm (util/progress_bar.py); pycubexr (fileio/file_reader/__init__.py
# loads every reader); scipy (hypotheses.py does `import scipy.optimize` in compute_coefficients).
# The rest of the pins are those packages' own dependencies, as resolved on 2026-11 for CPython 3.11.
# Result: ~260 MB, about 3 s with uv and a cold cache (the full `pip install extrap` is ~540 MB).
#
# Needs CPython 3.11 or 3.12 (numpy 1.26.4 has no wheels past 3.12, scipy 1.17 needs >= 3.11) and
# PyPI. Uses uv when it can find one ($UV, else `uv` on PATH, else ddlbench's .venv/bin/uv), else
# python -m venv + pip. Environment: UV, EXTRAP_PYTHON (interpreter to base the venv on).
# Skips all work when VENV_DIR/.installed records the same pins and interpreter and extrap imports.
#
# Exit status: 0 ready; 3 the environment cannot be built on this machine (no CPython 3.11 or 3.12, no
# package index, a pin the index lacks: the cross-check tests skip with the reason, or fail under
# DDLBENCH_REQUIRE_EXTRAP=1); 1 anything else (bad usage, a directory it must not replace, an Extra-P that
# installs but does not model as it should).
set -euo pipefail

EXTRAP_PIN="extrap==4.2.5"
PINS=(
    numpy==1.26.4
    scipy==1.17.1
    marshmallow==3.26.2
    packaging==26.3
    tqdm==4.70.1
    pycubexr==2.1.1
    matplotlib==3.11.2
    contourpy==1.3.3
    cycler==0.12.1
    fonttools==4.68.0
    kiwisolver==1.5.1
    pillow==13.0.0
    pyparsing==3.3.3
    python-dateutil==4.0.0
    tzdata==2026.6
)

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { echo "[extrap.sh] $*" >&2; }
die() {
    log "error: $*"
    exit 1
}
unavailable() {
    log "unavailable: $*"
    exit 3
}
NO_INDEX="(is a package index reachable?)"

[[ $# -eq 1 && -n "$1" ]] || die "usage: envs/extrap.sh VENV_DIR"
VENV=$1
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
PY="$VENV/bin/python"
STAMP="$VENV/.installed"

# --- the base interpreter ------------------------------------------------------------------------
py_ok() { "$1" -c 'import sys; sys.exit(0 if sys.version_info[:2] in ((3, 11), (3, 12)) else 1)' 2>/dev/null; }
BASE_PY=""
if [[ -n "${EXTRAP_PYTHON:-}" ]]; then
    py_ok "$EXTRAP_PYTHON" || unavailable "EXTRAP_PYTHON=$EXTRAP_PYTHON is not a CPython 3.11 or 3.12"
    BASE_PY=$EXTRAP_PYTHON
else
    for cand in python3.11 python3.12 python3; do
        if command -v "$cand" >/dev/null 2>&1 && py_ok "$cand"; then
            BASE_PY=$(command -v "$cand")
            break
        fi
    done
fi
[[ -n "$BASE_PY" ]] || unavailable "no CPython 3.11 or 3.12 found (set EXTRAP_PYTHON=/path/to/python3.11)"
BASE_PY=$("$BASE_PY" -c 'import sys; print(sys.executable)')
PYVER=$("$BASE_PY" -c 'import platform; print(platform.python_version())')

SPEC="$EXTRAP_PIN ${PINS[*]} python=$PYVER"

# --- already done? -------------------------------------------------------------------------------
installed_ok() {
    [[ -f "$STAMP" && -x "$PY" ]] || return 1
    [[ "$(cat "$STAMP")" == "$SPEC" ]] || return 1
    # The stamp is written only after the smoke test passed; here a cheap check that it still holds.
    "$PY" -c 'import sys, importlib.metadata as m; sys.exit(0 if m.version("extrap") == sys.argv[1] else 1)' \
        "${EXTRAP_PIN#extrap==}" 2>/dev/null
}
if installed_ok; then
    log "Extra-P ${EXTRAP_PIN#extrap==} already installed in $VENV"
    exit 0
fi

# Refuse to wipe a directory that is not a venv.
if [[ -e "$VENV" ]]; then
    [[ -d "$VENV" ]] || die "$VENV exists and is not a directory"
    if [[ ! -f "$VENV/pyvenv.cfg" ]] && [[ -n "$(ls -A "$VENV")" ]]; then
        die "$VENV is a non-empty directory that is not a virtual environment; refusing to replace it"
    fi
fi

# One installer at a time per venv (two concurrent test runs, say).
if command -v flock >/dev/null 2>&1; then
    mkdir -p "$(dirname "$VENV")"
    exec 9>"$VENV.lock"
    flock 9
    if installed_ok; then
        log "Extra-P ${EXTRAP_PIN#extrap==} already installed in $VENV"
        exit 0
    fi
fi

# --- installer -----------------------------------------------------------------------------------
UV_BIN=""
if [[ -n "${UV:-}" ]]; then
    [[ -x "$UV" ]] || command -v "$UV" >/dev/null 2>&1 || die "UV=$UV is not an executable"
    UV_BIN=$UV
elif command -v uv >/dev/null 2>&1; then
    UV_BIN=$(command -v uv)
elif [[ -x "$HERE/../.venv/bin/uv" ]]; then
    UV_BIN="$HERE/../.venv/bin/uv"
fi

rm -f "$STAMP"
start=$SECONDS
if [[ -n "$UV_BIN" ]]; then
    log "creating $VENV with $("$UV_BIN" --version) on Python $PYVER"
    export UV_PYTHON_DOWNLOADS=never # only PyPI is reachable: never fetch a managed interpreter
    "$UV_BIN" venv --quiet --clear --python "$BASE_PY" "$VENV" || die "uv venv failed"
    "$UV_BIN" pip install --quiet --python "$PY" --no-deps "$EXTRAP_PIN" || unavailable "installing $EXTRAP_PIN failed $NO_INDEX"
    "$UV_BIN" pip install --quiet --python "$PY" "${PINS[@]}" || unavailable "installing the pinned dependencies failed $NO_INDEX"
else
    log "creating $VENV with python -m venv + pip on Python $PYVER (no uv found)"
    "$BASE_PY" -m venv --clear "$VENV" || die "python -m venv failed"
    PIP=("$PY" -m pip --quiet --disable-pip-version-check --no-input)
    "${PIP[@]}" install --no-deps "$EXTRAP_PIN" || unavailable "installing $EXTRAP_PIN failed $NO_INDEX"
    # extrap's own metadata still asks for PySide6-Essentials and scikit-learn: not wanted, do not warn.
    "${PIP[@]}" install --no-warn-conflicts "${PINS[@]}" || unavailable "installing the pinned dependencies failed $NO_INDEX"
fi

# --- smoke test: the driver must model y = 2 + 3p and say so ---------------------------------------
out=$(echo '{"parameters":["p"],"points":[[2],[4],[8],[16],[32]],"values":[[8],[14],[26],[50],[98]]}' |
    "$PY" "$HERE/extrap_driver.py") || die "smoke test: extrap_driver.py failed in $VENV"
"$PY" -c '
import json, sys
r = json.loads(sys.argv[1])
t = r["terms"]
ok = (len(t) == 1 and abs(t[0]["coefficient"] - 3) < 1e-9 and abs(r["constant"] - 2) < 1e-9
      and t[0]["factors"][0]["exponent_poly"] == 1.0 and t[0]["factors"][0]["exponent_log"] == 0.0)
sys.exit(0 if ok else 1)' "$out" || die "smoke test: Extra-P did not select 2 + 3*p: $out"

echo "$SPEC" >"$STAMP"
log "Extra-P ${EXTRAP_PIN#extrap==} ready in $VENV ($((SECONDS - start)) s)"
