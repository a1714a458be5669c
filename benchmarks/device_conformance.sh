#!/usr/bin/env bash
# The compatibility issue's GPU steps in one device call:
#   bash benchmarks/device_conformance.sh conformance   (build, torch's tests in 4 modes)
#   bash benchmarks/device_conformance.sh libraries     (build if needed, the GPU libraries suite)
#   bash benchmarks/device_conformance.sh conformance libraries   (both, in one call)
#   bash benchmarks/device_conformance.sh bench         (step and pair times, native and memalloc side by side)
# Env: CONFORMANCE_LANES, CONFORMANCE_ONLY, CONFORMANCE_BUDGET (s), CONFORMANCE_TIMEOUT
# (s per test), GPU_TESTS (more GPU test paths for the libraries step).
# The upstream test files travel as the git-ignored upstream/ (carry it).
# Results under $OUT: conformance.json, conformance-logs.tgz, libraries.log.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/memalloc-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
steps=("${@:-conformance}")

if ! python3 -c "import memalloc._C as c; assert c.has_torch_cuda" 2>/dev/null; then
  echo "== build"
  start=$(date +%s)
  if ! python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then tail -60 "$OUT/build.log"; exit 1; fi
  echo "built in $(( $(date +%s) - start )) s"
fi
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"

for what in "${steps[@]}"; do
case "$what" in
  conformance)
    echo "== torch's allocator tests, native and under memalloc"
    rm -rf /tmp/conformance
    python3 -m benchmarks.conformance --out /tmp/conformance --budget "${CONFORMANCE_BUDGET:-420}" \
      --timeout "${CONFORMANCE_TIMEOUT:-150}" \
      ${CONFORMANCE_LANES:+--lanes "$CONFORMANCE_LANES"} ${CONFORMANCE_ONLY:+--only "$CONFORMANCE_ONLY"}
    cp /tmp/conformance/conformance.json "$OUT/"
    tar czf "$OUT/conformance-logs.tgz" -C /tmp/conformance . ;;
  libraries)
    echo "== the libraries suite on CUDA (and the GPU tests named in GPU_TESTS)"
    export MEMALLOC_GPU_RESULTS="$OUT/gpu_scenarios.jsonl"
    python3 -m pytest -m gpu -q -rfs tests/gpu/test_cuda_libraries.py ${GPU_TESTS:-} 2>&1 | tee "$OUT/libraries.log" | tail -40 ;;
  bench)
    echo "== step and pair times, native and memalloc in one run"
    python3 -m benchmarks.run --suite gpu --allocators native,memalloc --groups micro,transformer \
      --repeats "${BENCH_REPEATS:-3}" --out "$OUT/gpu-bench.json" 2>&1 | tail -25 ;;
esac
done
