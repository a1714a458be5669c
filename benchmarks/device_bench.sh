#!/usr/bin/env bash
# The GPU benchmark suite in one device call:
#   bash benchmarks/device_bench.sh [options of python -m benchmarks.run --suite gpu]
# Installs the RMM wheels carried in .whl/ (when present), builds memalloc,
# runs the suite, and writes $OUT/gpu-bench.json (committed under
# benchmarks/results/ as <date>-gpu-bench.json).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/memalloc-out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
# Incremental (ninja): cheap when device_run.sh built it in the same call.
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
python3 -m benchmarks.run --suite gpu --out "$OUT/gpu-bench.json" "$@"
