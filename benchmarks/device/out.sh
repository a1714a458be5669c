# Sourced by the device scripts (tests.sh, steps.sh)
# after they set DEVICE_FIGURES (file names): at most 8 files come back from
# a device call, so every step writes under OUT=/tmp/memalloc-work (kept
# across invocations in one call), and at exit the figure files are copied to
# the call's own $OUT (FINAL here) and everything else goes as
# $FINAL/logs.tgz. Also: the repository root as working directory and on
# PYTHONPATH, and MEMALLOC_GPU_RESULTS (tests/gpu/test_cuda.py's record())
# in the work folder.
FINAL=${OUT:-/tmp/memalloc-out}
OUT=/tmp/memalloc-work
mkdir -p "$OUT" "$FINAL"
trap 'exit 143' TERM INT  # so that a kill still runs the EXIT trap below
trap 'for f in $DEVICE_FIGURES; do [ -f "$OUT/$f" ] && cp "$OUT/$f" "$FINAL/"; done; tar czf "$FINAL/logs.tgz" -C "$OUT" .' EXIT
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONPATH=$PWD
export MEMALLOC_GPU_RESULTS="$OUT/gpu_scenarios.jsonl"
