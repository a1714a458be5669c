#!/usr/bin/env bash
# GPU steps beside the test suite (tests.sh), any of them in one device call,
# in the order given:
#   bash benchmarks/device/steps.sh build ipc fitdiag fit planner steptime conformance
#   build        build the extension unless a carried one imports
#   ipc          CUDA IPC both ways, native and memalloc, plain and expandable
#                (tests/gpu/test_cuda_ipc.py), the expandable and compat IPC tests
#   fitdiag      the fit workload at batch FITDIAG_BATCH (38) natively and under
#                memalloc's plain mode, FITDIAG_STEPS (18) steps, torch's history
#                on: $OUT/fitdiag-*.pickle.gz for benchmarks/fit/diff.py
#   fit          the fit benchmark in every mode, memalloc's default included
#   planner      tests/gpu/test_cuda_planner.py (PLANNER_K narrows it: -k text)
#   steptime     tests/gpu/test_cuda_step_time.py (STEP_TIME_K narrows it)
#   callbackparts  the Lightning timing case (tests/callback_cases/lightning_timing.py, the
#                callback cost test's) once per piece of MemoryMonitor, CALLBACK_PROCS (2)
#                processes each in turn: without it, with it, with it but no batch-end work,
#                its trackers alone, its flight recorder alone, memalloc.step() alone; the
#                median step time of each process ($OUT/callbackparts.log)
#   stepab       two allocators in lockstep on STEPAB_GROUP (bf16_lockstep), STEPAB_PAIRS (8)
#                process pairs, for each "A:B" of STEPAB (default memalloc_plain:memalloc_expandable,
#                expandable's own cost; e.g. native:expandable, memalloc_expandable:memalloc_expandable_noipc,
#                native:native_control for the noise); "A:B:N" runs N pairs of that one;
#                STEPAB_ALIVE (4) pairs alive at once (benchmarks/speed/lockstep.py's crowd)
#   fitreplay    FITREPLAY_SNAPSHOTS (carried torch snapshots) replayed with real
#                allocations natively and under memalloc_plain (benchmarks/fit/replay_gpu.py)
#   pagemoves    a trace of PAGEMOVES_WORKLOAD (gpt2; or transformer = the bf16 loop) recorded on
#                the GPU (benchmarks/traces/record.py, $OUT/traces/W.mtrace.gz, in logs.tgz;
#                PAGEMOVES_STEPS steps, PAGEMOVES_CONF more config for the recording run, e.g.
#                expandable_segments:True: its own page moves are in the trace) replayed step by
#                step under expandable segments (python -m memalloc replay --per-step): do its steps
#                move pages?
#   conformance  torch's own allocator tests (test_cuda.py's allocator selection, the
#                cudagraph trees), natively and under memalloc, every lane unless
#                CONFORMANCE_LANES picks some, e.g. cuda:memalloc:default (memalloc's
#                default, expandable segments, whose native runs are the committed ones,
#                to merge with conformance --merge), trees:memalloc:default, or
#                cuda:native:expandable_unsaid (native torch with expandable segments
#                the tests are not told of: the peer); CONFORMANCE_ONLY=FILE a list of
#                node ids, CONFORMANCE_BUDGET (420 s), CONFORMANCE_TIMEOUT (150 s per
#                test); needs the git-ignored upstream/ carried (carry: ["upstream"])
#   libraries    the GPU libraries suite (tests/gpu/test_cuda_libraries.py) and the
#                GPU tests named in GPU_TESTS
#   bench        the GPU benchmark suite (python -m benchmarks gpu) with BENCH_ARGS
#                (default: every allocator and group; e.g. BENCH_ARGS="--allocators
#                native,memalloc --groups micro,transformer" for step and pair times
#                side by side), after installing the RMM wheels carried in .whl/
#   two_gpu      on nvidia-h200-x2 (two GPUs, NCCL; NVLink multicast stays off, KINDS.md:
#                shared machines): tests/gpu/test_cuda_distributed.py (DDP and FSDP2, one
#                rank per GPU, native / memalloc / memalloc plain, the flight recorder's
#                merged report), tests/gpu/test_compat.py's two-GPU cases (fsdp2, nccl)
#                under the default (expandable segments) and under
#                MEMALLOC_CONF=expandable_segments:False, and examples/ddp.py's NCCL path
#                under memalloc (--ranks 2)
# Results under $OUT: gpu_scenarios.jsonl (every GPU test's recorded figures),
# fit-more.json, conformance.json, gpu-bench.json, logs.tgz (the logs, fitdiag's
# snapshots, conformance's logs).
# At most 8 files come back from a device call: every step writes under
# $WORK, and the end copies the figures (gpu_scenarios.jsonl, fit-more.json,
# conformance.json, gpu-bench.json) to $OUT and the rest as $OUT/logs.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1
DEVICE_FIGURES="gpu_scenarios.jsonl fit-more.json conformance.json gpu-bench.json"
source "$(dirname "$0")/out.sh"
rc=0
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
for what in "$@"; do
  start=$(date +%s)
  echo "== $what"
  case "$what" in
    build)
      if python3 -c "import memalloc._C as c; assert c.has_torch_cuda" 2>/dev/null; then
        echo "carried build imports"
      else
        python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
        grep -i "warning" "$OUT/build.log" | grep -v -i setuptools | head -20
      fi ;;
    ipc)
      python3 -m pytest -q -rfs tests/unit/test_ipc_wire.py 2>&1 | tail -3
      python3 -m pytest -m gpu -v -rfs tests/gpu/test_cuda_ipc.py tests/gpu/test_cuda_expandable.py \
        "tests/gpu/test_compat.py::test_ipc" 2>&1 | tee "$OUT/ipc.log" | grep -E "PASS|FAIL|ERROR|Error|assert|passed|failed" | head -60
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    fitdiag)
      b=${FITDIAG_BATCH:-38}; n=${FITDIAG_STEPS:-18}; f=${FITDIAG_FRACTION:-0.1107}
      env -u PYTORCH_CUDA_ALLOC_CONF -u MEMALLOC_CONF python3 -m benchmarks fit --worker native "$b" \
        --steps "$n" --fraction "$f" --history /tmp/fitdiag-native.pickle > "$OUT/fitdiag-native.json" 2> "$OUT/fitdiag-native.err" &
      env -u PYTORCH_CUDA_ALLOC_CONF MEMALLOC_CONF=expandable_segments:False python3 -m benchmarks fit \
        --worker memalloc "$b" --steps "$n" --fraction "$f" --history /tmp/fitdiag-memalloc.pickle \
        > "$OUT/fitdiag-memalloc.json" 2> "$OUT/fitdiag-memalloc.err" &
      wait
      tail -c 600 "$OUT"/fitdiag-*.json
      for m in native memalloc; do gzip -c /tmp/fitdiag-$m.pickle > "$OUT/fitdiag-$m.pickle.gz"; done
      ls -la "$OUT"/fitdiag-* ;;
    fit)
      python3 -m benchmarks fit --out "$OUT/fit-more.json" --parallel 6 \
        --modes native,expandable,cudaMallocAsync,memalloc,memalloc_plain 2>&1 | tee "$OUT/fit.log" | tail -12 ;;
    planner)
      python3 -m pytest -m gpu -v -rfs tests/gpu/test_cuda_planner.py ${PLANNER_K:+-k "$PLANNER_K"} 2>&1 \
        | tee "$OUT/planner.log" | tail -15
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    steptime)
      python3 -m pytest -m gpu -v -rfs tests/gpu/test_cuda_step_time.py ${STEP_TIME_K:+-k "$STEP_TIME_K"} 2>&1 \
        | tee "$OUT/steptime.log" | tail -15
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    callbackparts)
      for i in $(seq "${CALLBACK_PROCS:-2}"); do
        for v in "0:" "1:" "1:noend" "0:trackers" "0:flight" "0:steps"; do
          rm -rf /tmp/callbackparts
          PYTHONPATH=$PWD:$PWD/tests/callback_cases timeout 120 python3 tests/callback_cases/lightning_timing.py \
            /tmp/callbackparts "${v%%:*}" 60 cuda ${v#*:} 2> "$OUT/callbackparts.err" | grep RESULT | python3 -c "
import json, statistics, sys
r = json.loads(sys.stdin.read().split('RESULT ', 1)[1])
print('with=$v', f\"median step {statistics.median(r['times'][10:]) * 1e3:.2f} ms\", r['counters'])" \
            || tail -3 "$OUT/callbackparts.err"
        done
      done 2>&1 | tee "$OUT/callbackparts.log" ;;
    stepab)
      python3 - <<'PY' 2>&1 | tee "$OUT/stepab.log" | tail -5
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests", "gpu"))
from benchmarks.speed.lockstep import pooled
from test_cuda import record
group = os.environ.get("STEPAB_GROUP", "bf16_lockstep")
worker = lambda name: [sys.executable, "-m", "benchmarks.speed.worker", name, group]
for pair in os.environ.get("STEPAB", "memalloc_plain:memalloc_expandable").split(","):
    a, b, *n = pair.split(":")
    r = pooled({a: worker(a), b: worker(b)}, int(n[0] if n else os.environ.get("STEPAB_PAIRS", "8")), 25,
               env=dict(os.environ, MEMALLOC_BENCH_CPUS="2-5"), alive=int(os.environ.get("STEPAB_ALIVE", "4")))
    counts = [run["results"] for run in r["runs"]]  # per pair: each worker's device calls in its timed steps
    record("step_time_lockstep", f"{b}_vs_{a}/{group}",
           dict({k: v for k, v in r.items() if k != "runs"}, worker_results=counts,
                ms=[run["ms"] for run in r["runs"]]))
    print(f"{b} / {a} on {group}:", r["median_ratio"], r["per_process_pair"], flush=True)
    print("  timed steps' device calls:", [{w: c.get("timed_steps_counts") for w, c in x.items()} for x in counts],
          flush=True)
PY
      ;;
    fitreplay)
      for snap in ${FITREPLAY_SNAPSHOTS:-.devdata/fitdiag-native.pickle.gz .devdata/fitdiag-memalloc.pickle.gz}; do
        for m in native memalloc_plain; do
          env -u PYTORCH_CUDA_ALLOC_CONF -u MEMALLOC_CONF python3 -m benchmarks fit-replay "$snap" "$m" \
            --fraction "${FITDIAG_FRACTION:-0.1107}" > "$OUT/fitreplay-$(basename "$snap" .pickle.gz)-$m.json" &
        done
      done
      wait
      for f in "$OUT"/fitreplay-*.json; do echo "$(basename "$f"): $(cat "$f")"; done
      cat "$OUT"/fitreplay-*.json | python3 -c "import sys,json; [print(json.dumps({'scenario':'fit_replay','mode':d['snapshot']+'/'+d['mode'],'result':d})) for d in map(json.loads, sys.stdin)]" >> "$OUT/gpu_scenarios.jsonl" ;;
    pagemoves)
      w=${PAGEMOVES_WORKLOAD:-gpt2}
      python3 -m benchmarks record-traces --out "$OUT/traces" --workloads "$w" \
        ${PAGEMOVES_STEPS:+--steps "$PAGEMOVES_STEPS"} ${PAGEMOVES_CONF:+--conf "$PAGEMOVES_CONF"} 2>&1 | tail -3
      python3 -m memalloc replay "$OUT/traces/$w.mtrace.gz" --per-step --config expandable_segments:True \
        --config expandable_segments:True,reuse_free_pages:False --json "$OUT/pagemoves-$w.json" 2>&1 \
        | tee -a "$OUT/pagemoves.log"
      OUT="$OUT" W="$w" python3 -c "import os,json; w=os.environ['W']; d=json.load(open(os.environ['OUT']+f'/pagemoves-{w}.json'))
[print(json.dumps({'scenario':'page_moves','mode':w+'/'+c,'result':rows['0']})) for t in d['per_step'].values() for c, rows in t.items()]" \
        >> "$OUT/gpu_scenarios.jsonl" ;;
    conformance)
      rm -rf "$OUT/conformance"
      python3 -m benchmarks conformance --out "$OUT/conformance" --budget "${CONFORMANCE_BUDGET:-420}" \
        --timeout "${CONFORMANCE_TIMEOUT:-150}" ${CONFORMANCE_LANES:+--lanes "$CONFORMANCE_LANES"} \
        ${CONFORMANCE_ONLY:+--only "$CONFORMANCE_ONLY"} 2>&1 | tail -20
      cp "$OUT/conformance/conformance.json" "$OUT/" ;;
    libraries)
      python3 -m pytest -m gpu -q -rfs tests/gpu/test_cuda_libraries.py ${GPU_TESTS:-} 2>&1 \
        | tee "$OUT/libraries.log" | tail -40
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    bench)
      if ls .whl/*.whl > /dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
          --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH
      fi
      # shellcheck disable=SC2086  # BENCH_ARGS: options, split on spaces
      python3 -m benchmarks gpu --out "$OUT/gpu-bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -25
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    two_gpu)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
      python3 -c "import torch; print(torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))"
      echo "-- dist"
      python3 -m pytest -m gpu -v -rfs tests/gpu/test_cuda_distributed.py 2>&1 | tee "$OUT/dist.log" | tail -15
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      echo "-- compat (default: expandable segments, then plain segments)"
      python3 -m pytest -m gpu -v -rfs tests/gpu/test_compat.py -k "fsdp2 or nccl" 2>&1 | tee "$OUT/compat.log" | tail -5
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      MEMALLOC_CONF=expandable_segments:False python3 -m pytest -m gpu -v -rfs tests/gpu/test_compat.py \
        -k "fsdp2 or nccl" 2>&1 | tee "$OUT/compat-plain.log" | tail -5
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      echo "-- example"
      (cd examples && timeout 300 python3 ddp.py --model transformer --ranks 2) 2>&1 | tee "$OUT/ddp-example.log" | tail -8
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    *) echo "unknown step $what"; exit 2 ;;
  esac
  echo "-- $what took $(( $(date +%s) - start )) s"
  [ -f "$OUT/gpu_scenarios.jsonl" ] && cp "$OUT/gpu_scenarios.jsonl" "$FINAL/"
done
exit $rc
