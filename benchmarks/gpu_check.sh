#!/usr/bin/env bash
# The GPU checks of one short device lease, in one go (about 5 min on one H100/H200): what CI, which has
# no GPU, never runs. Run from the repository root on a machine with CUDA and torch:
#
#   benchmarks/gpu_check.sh            # logs under $OUT (default /tmp/ddlbench-gpu-check)
#
# 1. every test marked `gpu` (NCCL, CUDA events, the CUDA memory window, TF32/bf16/fp16, the rank's GPU);
#    the per-strategy NCCL cases skip where the host has fewer GPUs than their ranks;
# 2. the launch-level verdicts on steady GPU steps (tests/test_verdict_runs.py: an A/A pair at 1 and 3
#    launches gives no verdict, a 30 % injected slowdown is called worse), with the figures printed;
# 3. benchmarks/overhead.py on CUDA: ddlbench against a bare DDP loop, one rank, resnet18, batch 128.
# Where the package's dependencies are missing (a bare GPU image), wheels in .whl/ are installed first
# into /tmp/site (pip download ... -d .whl jsonschema jsonschema-specifications referencing rpds-py).
set -uo pipefail
OUT=${OUT:-/tmp/ddlbench-gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
nvidia-smi -L
$PY -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'GPUs', torch.cuda.device_count())"
status=0
run() {  # run NAME SECONDS COMMAND...: one check, its log under $OUT, its exit status remembered
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit} s)"
    local started=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $((SECONDS - started)) s"
    [ "$rc" -eq 0 ] || status=1
}
run gpu-tests 170 $PY -m pytest -p no:cacheprovider -q -ra -m gpu tests/test_gpu.py tests/test_memory.py tests/test_execution.py
run verdict-runs 170 $PY -m pytest -p no:cacheprovider -q -ra -s tests/test_verdict_runs.py
run overhead 120 $PY benchmarks/overhead.py --device cuda --ranks 1 --model resnet18 --batch 128 --warmup 5 --steps 50 --pairs 2
exit $status
