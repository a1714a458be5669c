#!/usr/bin/env bash
# Every GPU step in one device call: build, GPU tests, CPU tests, results file.
#   bash benchmarks/device_run.sh            (OUT=dir for logs; default /tmp/memalloc-out)
# Writes $OUT/gpu-results.json (the file committed under benchmarks/results/).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/memalloc-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."

echo "== build"
if ! python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
  tail -60 "$OUT/build.log"; exit 1
fi
grep -i "warning" "$OUT/build.log" | grep -v -i setuptools | head -20

echo "== GPU tests"
export MEMALLOC_GPU_RESULTS="$OUT/gpu_scenarios.jsonl"
export MEMALLOC_GPU_ARTIFACTS="$OUT"  # e.g. the leak report of the ResNet-18 loop
rm -f "$MEMALLOC_GPU_RESULTS"
# MEMALLOC_GPU_TESTS narrows the GPU tests (pytest paths / node ids) so that
# the suite can be split over two device calls; default: all of tests/gpu and
# the backend contract suite (tests/contract, its CUDA half).
read -r -a gpu_tests <<< "${MEMALLOC_GPU_TESTS:-tests/gpu tests/contract}"
python3 -m pytest -m gpu -v -rs "${gpu_tests[@]}" --junitxml="$OUT/gpu_junit.xml" 2>&1 | tee "$OUT/gpu_tests.log"
gpu_rc=${PIPESTATUS[0]}

# The CPU tests that depend on the device machine's Python (3.12 there):
# the GIL-free frame walk and stack attribution. MEMALLOC_DEVICE_CPU_TESTS=all
# runs the whole CPU suite instead (CI runs it on every push), =none none.
case "${MEMALLOC_DEVICE_CPU_TESTS:-subset}" in
  all) cpu_tests=(tests --ignore=tests/gpu) ;;
  none) cpu_tests=() ;;
  *) cpu_tests=(tests/unit/test_pyframes.py tests/unit/test_recording.py tests/integration/test_api.py tests/integration/test_leaks.py tests/unit/test_oom_report.py tests/unit/test_tracker.py) ;;
esac
if [ ${#cpu_tests[@]} -gt 0 ]; then
  echo "== CPU tests on the device machine"
  python3 -m pytest -q -rfs "${cpu_tests[@]}" 2>&1 | tail -30 | tee "$OUT/cpu_tests.log"
fi

echo "== results"
python3 -m benchmarks.collect_gpu_results --junit "$OUT/gpu_junit.xml" \
  --scenarios "$MEMALLOC_GPU_RESULTS" --command "${MEMALLOC_CONF:+MEMALLOC_CONF=$MEMALLOC_CONF }MEMALLOC_GPU_TESTS='${MEMALLOC_GPU_TESTS:-tests/gpu}' MEMALLOC_DEVICE_CPU_TESTS=${MEMALLOC_DEVICE_CPU_TESTS:-subset} bash benchmarks/device_run.sh" \
  --out "$OUT/gpu-results.json"
exit "$gpu_rc"
