#!/usr/bin/env bash
# Install Horovod into a ddlbench venv: `envs/horovod.sh [VENV]` (default .venv), or `make horovod`.
#
# Why a script: Horovod 0.28.1 is the last release and ships only an sdist. Its CMakeLists.txt and
# horovod/torch/CMakeLists.txt pin CMAKE_CXX_STANDARD 14, while torch >= 2.1 headers refuse anything
# below C++17, so a plain `pip install horovod` fails after ~4 minutes of compiling. We download the
# sdist (hash-checked against the sha256 PyPI publishes), raise the standard to 17, build a wheel
# once and cache it; later runs (CI included, if the cache folder persists) only install the wheel.
#
# Gloo only, no MPI: ddlbench starts its ranks itself (local processes or srun) and never through
# horovodrun/mpirun, so the strategy always selects Horovod's gloo controller and gloo CPU ops.
# An MPI build would add a Debian package (libopenmpi-dev), link libmpi into the extension, and give
# ddlbench nothing it uses. GPU operations are off unless asked for: without them Horovod reduces
# CUDA tensors through gloo on host copies. On a GPU cluster with the CUDA toolkit and an NCCL that has
# headers and libnccl.so, run `HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=/path make horovod`
# (HOROVOD_NCCL_LINK=SHARED links it dynamically); this path is not exercised by CI.
#
# The wheel's extension links against the torch it was built with, so the cache key holds the torch
# version (which names the CUDA variant too), the Python tag and the machine.
#
# Environment: DDLBENCH_WHEEL_CACHE (default ~/.cache/ddlbench/wheels), MAKEFLAGS (default -j<cores>, at most 8),
# HOROVOD_GPU_OPERATIONS and other HOROVOD_* build variables (passed through to the build).
set -euo pipefail

HOROVOD_VERSION=0.28.1
# From https://pypi.org/simple/horovod/ (the sdist's published sha256).
HOROVOD_SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0

VENV=${1:-${VENV:-.venv}}
PY="$VENV/bin/python"
CACHE=${DDLBENCH_WHEEL_CACHE:-$HOME/.cache/ddlbench/wheels}

log() { echo "[horovod.sh] $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

[[ -x "$PY" ]] || die "no python at $PY (create the venv first: make venv)"
"$PY" -c 'import torch' 2>/dev/null || die "torch is not installed in $VENV (make venv first)"

check_build() {
    # horovodrun --check-build prints what the installed extension was built with.
    "$VENV/bin/horovodrun" --check-build
}

installed_ok() {
    "$PY" - "$HOROVOD_VERSION" <<'EOF' 2>/dev/null
import sys
import horovod
import horovod.torch  # loads the compiled extension: catches a wheel built for another torch

sys.exit(0 if horovod.__version__ == sys.argv[1] else 1)
EOF
}

if installed_ok; then
    log "horovod $HOROVOD_VERSION already installed in $VENV"
    check_build
    exit 0
fi

key=$("$PY" -c '
import platform, sys, torch
print(f"torch-{torch.__version__}-cp{sys.version_info.major}{sys.version_info.minor}-{platform.machine()}")')
gpu_ops=${HOROVOD_GPU_OPERATIONS:-}
if [[ -n "$gpu_ops" ]]; then key="$key-gpu$gpu_ops"; fi
wheel_dir="$CACHE/horovod-$HOROVOD_VERSION/$key"
wheel=$(ls "$wheel_dir"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -n 1 || true)

if [[ -z "$wheel" ]]; then
    # Build tools: only installed when missing, and only through apt (Debian).
    missing=()
    command -v cmake >/dev/null || missing+=(cmake)
    command -v g++ >/dev/null || missing+=(g++)
    command -v make >/dev/null || missing+=(make)
    if ((${#missing[@]})); then
        [[ $(id -u) == 0 ]] || die "missing build tools: ${missing[*]} (install them, or rerun as root)"
        log "installing ${missing[*]} with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
    # --no-build-isolation: the build must see the venv's torch (and its headers), not a fresh one, so
    # setup.py's setup_requires (its runtime requirements) must already be in the venv.
    "$PY" -m pip install --quiet 'setuptools>=70.1' cloudpickle psutil pyyaml packaging

    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    printf 'horovod==%s --hash=sha256:%s\n' "$HOROVOD_VERSION" "$HOROVOD_SDIST_SHA256" >"$work/req.txt"
    log "downloading the horovod $HOROVOD_VERSION sdist from PyPI"
    # --require-hashes: pip refuses a file whose sha256 differs from the pinned one.
    "$PY" -m pip download --quiet --no-deps --no-binary :all: --require-hashes -r "$work/req.txt" -d "$work"
    sdist="$work/horovod-$HOROVOD_VERSION.tar.gz"
    echo "$HOROVOD_SDIST_SHA256  $sdist" | sha256sum --check --quiet || die "sdist hash mismatch"
    tar -xzf "$sdist" -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"

    # The one change: C++14 -> C++17 in the two CMakeLists that pin it; fail loudly if upstream moved.
    for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
        grep -q 'set(CMAKE_CXX_STANDARD 14)' "$src/$f" || die "$f has no 'set(CMAKE_CXX_STANDARD 14)' to patch"
        sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/$f"
    done

    # one compile job per core, at most 8: the torch-facing files need about 1 GiB each
    jobs=$(nproc)
    if ((jobs > 8)); then jobs=8; fi
    log "building the wheel ($key${gpu_ops:+, GPU ops $gpu_ops}); this takes minutes"
    started=$(date +%s)
    env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 MAKEFLAGS="${MAKEFLAGS:--j$jobs}" \
        "$PY" -m pip wheel --no-build-isolation --no-deps --no-cache-dir -w "$work/dist" "$src"
    log "built in $(($(date +%s) - started)) s"

    built=$(ls "$work"/dist/horovod-"$HOROVOD_VERSION"-*.whl)
    mkdir -p "$wheel_dir"
    # Copy then rename: a concurrent reader never sees half a wheel.
    cp "$built" "$wheel_dir/.partial.whl"
    wheel="$wheel_dir/$(basename "$built")"
    mv "$wheel_dir/.partial.whl" "$wheel"
fi

log "installing $wheel"
"$PY" -m pip install --quiet --force-reinstall --no-deps "$wheel"
# Second pass without --no-deps: pulls horovod's few pure-Python requirements if any are missing.
"$PY" -m pip install --quiet "$wheel"
installed_ok || die "horovod $HOROVOD_VERSION does not import after installing $wheel"
check_build
