#!/usr/bin/env bash
# The GPU test suite in as little device time as it can honestly take:
#   bash benchmarks/device/tests.sh [PHASE...]      (OUT=dir; default /tmp/memalloc-out)
# PHASE is one of (in the order they best run; each phase's junit comes back
# even when a later one is cut off by the call's limit; no PHASE: all cpu)
#   all          MEMALLOC_GPU_TESTS (pytest paths / node ids; default: tests/gpu and
#                the backend contract suite, tests/contract) in one pytest process
#   cpu          the CPU tests that depend on the device machine's Python (3.12
#                there): the GIL-free frame walk and stack attribution;
#                MEMALLOC_DEVICE_CPU_TESTS=all runs the whole CPU suite instead (CI
#                runs it on every push); not in gpu-results.json
#   lanes        the tests that check correctness only (no timing, no
#                reading of the device's free memory): five pytest processes
#                at once, each a lane of files, on one GPU (no test of them
#                fills the device or reads its free memory; those are below)
#   cuda         test_cuda.py: fills the device, reads its free memory, times
#                the C entry points; alone
#   expandable   expandable segments, zero setup and the backend contract
#                (free memory, OOMs); alone
#   costs        the flight recorder's costs and the step-time targets; alone
#   planner      the planner against a search with real OOMs; alone
#   compat_timing  torch.compile / cudnn.benchmark speed, 8 interleaved
#                rounds of fresh processes; alone
#   pair         test_cuda.py's pair-cost comparison of the two routes alone
#                (7 processes per mode)
# DEVICE_DEADLINE (seconds since the epoch; default: 560 s from the start)
# bounds every phase: a pytest process still running 30 s before it gets
# SIGINT, so it writes its junit (the tests it finished) and the collection
# below still runs, and a phase with under 20 s left is skipped, said so.
# Never wrap this script in an outer `timeout`: its kill would skip the EXIT
# trap that brings the files back. SUITE_K (a pytest -k expression) narrows
# every phase of the call to the tests it selects, e.g. SUITE_K=resnet for
# the planner's ResNet-50 case alone.
# A device call runs what fits its 600 s; gpu-results.json joins the junits
# of this invocation's phases (python -m benchmarks collect) with
# each test's seconds. It and gpu_scenarios.jsonl come back in $OUT; the
# logs, junits and artifacts (e.g. the leak report of the ResNet-18 loop) as
# $OUT/logs.tgz (out.sh).
set -uo pipefail
export PYTHONUNBUFFERED=1
DEVICE_FIGURES="gpu-results.json gpu_scenarios.jsonl"
source "$(dirname "$0")/out.sh"
rm -f "$OUT"/junit-*.xml "$OUT"/log-*.txt "$MEMALLOC_GPU_RESULTS"  # an earlier invocation's, in this call

echo "== build"
if ! python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
  tail -60 "$OUT/build.log"; exit 1
fi
export MEMALLOC_GPU_ARTIFACTS="$OUT/artifacts"; mkdir -p "$MEMALLOC_GPU_ARTIFACTS"
rc=0
FLIGHT_COST=tests/gpu/test_cuda_flight.py::test_the_file_backed_ring_costs_within_budget
FLIGHT_STEP=tests/gpu/test_cuda_flight.py::test_bf16_step_with_the_flight_recorder_within_2pct_of_native

DEVICE_DEADLINE=${DEVICE_DEADLINE:-$(( $(date +%s) + 560 ))}
suite() {  # suite NAME pytest-args...: one pytest process, its junit and log in $OUT
  local name=$1; shift
  local left=$(( DEVICE_DEADLINE - $(date +%s) - 30 ))
  if [ "$left" -lt 20 ]; then echo "-- $name: skipped, ${left} s left before the deadline"; return 1; fi
  timeout -s INT -k 20 "$left" \
    python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider ${SUITE_K:+-k "$SUITE_K"} "$@" \
    --junitxml="$OUT/junit-$name.xml" > "$OUT/log-$name.txt" 2>&1
  local r=$?
  [ "$r" -eq 124 ] && echo "-- $name: stopped at the deadline (SIGINT after ${left} s)"

  echo "-- $name: rc=$r $(tail -1 "$OUT/log-$name.txt")"
  return $r
}

if [ $# -eq 0 ]; then phases=(all cpu); else phases=("$@"); fi
for phase in "${phases[@]}"; do
  start=$(date +%s)
  echo "== $phase"
  case "$phase" in
    all)
      read -r -a gpu_tests <<< "${MEMALLOC_GPU_TESTS:-tests/gpu tests/contract}"
      suite all "${gpu_tests[@]}" || rc=1 ;;
    cpu)
      case "${MEMALLOC_DEVICE_CPU_TESTS:-subset}" in
        all) cpu_tests=(tests --ignore=tests/gpu) ;;
        none) cpu_tests=() ;;
        *) cpu_tests=(tests/unit/test_pyframes.py tests/unit/test_recording.py tests/integration/test_api.py
                      tests/integration/test_leaks.py tests/unit/test_oom_report.py tests/unit/test_tracker.py) ;;
      esac
      if [ ${#cpu_tests[@]} -gt 0 ]; then
        python3 -m pytest -q -rfs -p no:cacheprovider "${cpu_tests[@]}" > "$OUT/log-cpu.txt" 2>&1 || rc=1
        tail -30 "$OUT/log-cpu.txt"
      fi ;;
    lanes)
      suite lane1 tests/gpu/test_compat.py & p1=$!
      suite lane2 tests/gpu/test_cuda_leaks_real_models.py tests/gpu/test_cuda_breakdown_real_models.py & p2=$!
      suite lane3 tests/gpu/test_cuda_libraries.py tests/gpu/test_cuda_breakdown.py tests/gpu/test_parity.py & p3=$!
      suite lane4 tests/gpu/test_cuda_ipc.py tests/gpu/test_cuda_distributed.py \
        tests/gpu/test_cuda_flight.py --deselect "$FLIGHT_COST" --deselect "$FLIGHT_STEP" & p4=$!
      suite lane5 tests/gpu/test_cuda_callbacks.py tests/gpu/test_cuda_run_page.py tests/gpu/test_cuda_diff_notebook.py \
        tests/gpu/test_cuda_interface.py & p5=$!
      for p in $p1 $p2 $p3 $p4 $p5; do wait "$p" || rc=1; done ;;
    cuda) suite cuda tests/gpu/test_cuda.py || rc=1 ;;
    expandable) suite expandable tests/gpu/test_cuda_expandable.py tests/gpu/test_cuda_zero_setup.py tests/contract || rc=1 ;;
    costs) suite costs "$FLIGHT_COST" "$FLIGHT_STEP" tests/gpu/test_cuda_step_time.py \
      tests/gpu/test_cuda_callback_cost.py || rc=1 ;;
    planner) suite planner tests/gpu/test_cuda_planner.py || rc=1 ;;
    compat_timing) suite compat_timing tests/gpu/test_compat_timing.py || rc=1 ;;
    pair) suite pair tests/gpu/test_cuda.py::test_pair_cost_subclass_against_the_c_entry_route || rc=1 ;;
    *) echo "unknown phase $phase (all cpu lanes cuda expandable costs planner compat_timing pair)" >&2; exit 2 ;;
  esac
  echo "== $phase took $(( $(date +%s) - start )) s"
done

# Failures' reports, so that the call's output tail shows them.
grep -h -A30 "^FAILED\|^ERROR\|= FAILURES =" "$OUT"/log-*.txt 2>/dev/null | head -150
said="${MEMALLOC_CONF:+MEMALLOC_CONF=$MEMALLOC_CONF }${MEMALLOC_GPU_TESTS:+MEMALLOC_GPU_TESTS='$MEMALLOC_GPU_TESTS' }"
said+="${MEMALLOC_DEVICE_CPU_TESTS:+MEMALLOC_DEVICE_CPU_TESTS=$MEMALLOC_DEVICE_CPU_TESTS }${SUITE_K:+SUITE_K='$SUITE_K' }"
junits=("$OUT"/junit-*.xml)
if [ -e "${junits[0]}" ]; then  # a GPU phase ran (cpu alone writes none)
  python3 -m benchmarks collect --junit "${junits[@]}" --scenarios "$MEMALLOC_GPU_RESULTS" \
    --command "${said}bash benchmarks/device/tests.sh ${phases[*]}" --out "$OUT/gpu-results.json"
fi
exit $rc
