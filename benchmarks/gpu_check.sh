#!/usr/bin/env bash
# The GPU checks of one short device lease: what CI, which has no GPU, never runs. Run from the repository
# root on a machine with CUDA and torch, all parts or some of them:
#
#   benchmarks/gpu_check.sh                        # tests overhead analytic probe certify; logs under $OUT
#   benchmarks/gpu_check.sh tests analytic         # one device call (~4.5 min on an H200)
#   benchmarks/gpu_check.sh overhead               # another (~6.5 min): a lease's 15 minutes hold both
#
# Parts, with their wall time on one H200 (2026-11-28; each ddlbench or bare launch took 9-11 s there):
#   tests     every test marked `gpu` (not timed; 41 tests; a module's tests share one worker, so test_gpu.py's
#             strategy cases run one after another: 210 s reached 35 of 41 on an H200, hence 330 s):
#             every strategy's CUDA path against one process on the same GPU (on one GPU the ranks share
#             it, over gloo), NCCL where the host has a GPU per rank, binding and NUMA facts, CUDA events
#             and the traced steps, the allocator's figures, precisions, energy and NVML provenance;
#   overhead  benchmarks/overhead.py on CUDA: ddlbench against a bare DDP loop, one rank, resnet18, at
#             fp32, tf32 and bf16, batch 128 and 32 (steps of 7-20 ms), 3 alternating rounds each
#             (issue 31: ≥ 0.98): 6 × 3 × 2 launches, ~60 s per configuration;
#   analytic  benchmarks/gpu_analytic.py: the analytical model calibrated on the GPU, scored on
#             configurations the calibration never ran (time ≥ 90 %, memory ≥ 95 %): 63 s;
#   probe     benchmarks/gpu_probe.py: versions, NVML readings, NUMA, the cost of event stamps, gloo on
#             CUDA tensors: 93 s;
#   certify   issue 32's node levels on this host: `certify --level quick` (GEMM at fp32/tf32/bf16/fp16/fp8,
#             HBM copy, pinned host<->device copies per GPU, NVML health) and `--level burn-in` for
#             BURNIN_DURATION (default 60s; replays every round), each figure beside the card's peak and
#             achievable (benchmarks/certify_summary.py prints them); references proposed into $OUT.
#             On an H200: quick 17 s; burn-in 46 s at BURNIN_DURATION=30s (its rounds take 16-23 s each).
# Timed parts run alone, one after the other. Each part's limit can be set (GPU_TESTS_S, OVERHEAD_S,
# ANALYTIC_S). Where the package's dependencies are missing (a bare GPU image), wheels in .whl/ are
# installed first into /tmp/site (pip download ... -d .whl jsonschema jsonschema-specifications
# referencing rpds-py). The device tool returns at most 8 files: run with OUT=/tmp/gc and tar /tmp/gc.
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
WORKERS=${GPU_TEST_WORKERS:-8}
PARTS=${*:-tests overhead analytic probe certify}
for part in $PARTS; do
    case $part in
    tests)  # -v: with xdist only verbose output names each test as it ends (a summary needs a finished run)
        run gpu-tests "${GPU_TESTS_S:-330}" $PY -m pytest -p no:cacheprovider -v -ra -m gpu -n "$WORKERS" \
            tests/test_gpu*.py tests/test_memory.py tests/test_execution.py ;;
    overhead)
        for precision in ${OVERHEAD_PRECISIONS:-fp32 tf32 bf16}; do
            for batch in ${OVERHEAD_BATCHES:-128 32}; do
                run "overhead-$precision-b$batch" "${OVERHEAD_S:-75}" $PY benchmarks/overhead.py --device cuda \
                    --ranks 1 --model resnet18 --batch "$batch" --precision "$precision" --warmup 10 --steps 150 \
                    --pairs 3 --sides ddlbench,bare
            done
        done ;;
    analytic) run analytic "${ANALYTIC_S:-130}" $PY benchmarks/gpu_analytic.py --out "$OUT/analytic" ;;
    probe) run probe 120 $PY benchmarks/gpu_probe.py --json "$OUT/probe.json" ;;
    certify)  # exit 1 is expected: no reference file for this lease, so nothing can pass
        for level in quick burn-in; do
            run "certify-$level" "${CERTIFY_S:-200}" bash -c "$PY -m ddlbench certify --level $level \
                $([ "$level" = burn-in ] && echo "--duration ${BURNIN_DURATION:-60s}") --system lease \
                --partition gpu --write-references '$OUT/$level-refs.yaml' --json '$OUT/$level.json' \
                --db '$OUT/history.sqlite'; [ \$? -le 1 ]"
            $PY benchmarks/certify_summary.py "$OUT/$level.json" | tee -a "$OUT/certify-$level.log"
        done ;;
    *) echo "gpu_check: unknown part $part; parts: tests overhead analytic probe certify" >&2; exit 2 ;;
    esac
done
grep -h "ratio of medians\|^=== .*exit" "$OUT"/*.log
exit $status
