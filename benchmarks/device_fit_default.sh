#!/usr/bin/env bash
# Issue 25's GPU steps (expandable segments as the default, the planner), any
# of them in one device call, in the order given:
#   bash benchmarks/device_fit_default.sh build ipc fitdiag fit planner steptime conformance
#   build        build the extension unless a carried one imports
#   ipc          CUDA IPC both ways, native and memalloc, plain and expandable
#                (tests/gpu/test_cuda_ipc.py), the expandable and compat IPC tests
#   fitdiag      the fit workload at batch FITDIAG_BATCH (38) natively and under
#                memalloc's plain mode, FITDIAG_STEPS (18) steps, torch's history
#                on: $OUT/fitdiag-*.pickle.gz for benchmarks/fit_diff.py
#   fit          the fit benchmark in every mode, memalloc's default included
#   planner      tests/gpu/test_cuda_planner.py (PLANNER_K narrows it: -k text)
#   steptime     tests/gpu/test_cuda_step_time.py (STEP_TIME_K narrows it)
#   stepab       two allocators in lockstep on STEPAB_GROUP (bf16_lockstep), STEPAB_PAIRS (8)
#                process pairs, for each "A:B" of STEPAB (default memalloc_plain:memalloc_expandable,
#                expandable's own cost; e.g. native:expandable, memalloc_expandable:memalloc_expandable_noipc,
#                native:native_control for the noise); "A:B:N" runs N pairs of that one;
#                STEPAB_ALIVE (4) pairs alive at once (benchmarks/lockstep.py's crowd)
#   fitreplay    FITREPLAY_SNAPSHOTS (carried torch snapshots) replayed with real
#                allocations natively and under memalloc_plain (benchmarks/fit_replay_gpu.py)
#   pagemoves    a trace of PAGEMOVES_WORKLOAD (gpt2; or transformer = the bf16 loop) recorded on
#                the GPU (benchmarks/record_traces.py, $OUT/traces/W.mtrace.gz, in logs.tgz;
#                PAGEMOVES_STEPS steps, PAGEMOVES_CONF more config for the recording run, e.g.
#                expandable_segments:True: its own page moves are in the trace) replayed step by
#                step under expandable segments (python -m memalloc replay --per-step): do its steps
#                move pages?
#   conformance  torch's test_cuda.py allocator selection under memalloc's default
#                (expandable segments; no allocator variable set, so the tests expect
#                native's default layout), the native runs are the committed ones, to merge
#                (conformance --merge); CONFORMANCE_LANES picks others, e.g.
#                trees:memalloc:default, or cuda:native:expandable_unsaid (native torch
#                with expandable segments the tests are not told of: the peer);
#                CONFORMANCE_ONLY=FILE a list of node ids; needs the git-ignored
#                upstream/ carried (carry: ["upstream"])
# Results under $OUT: gpu_scenarios.jsonl (every GPU test's recorded figures),
# fit-more.json, conformance.json, logs.tgz (the logs, fitdiag's snapshots).
# At most 8 files come back from a device call: every step writes under
# $WORK, and the end copies the figures (gpu_scenarios.jsonl, fit-more.json,
# conformance.json) to $OUT and the rest as $OUT/logs.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1
DEVICE_FIGURES="gpu_scenarios.jsonl fit-more.json conformance.json"
source "$(dirname "$0")/device_out.sh"
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
      env -u PYTORCH_CUDA_ALLOC_CONF -u MEMALLOC_CONF python3 -m benchmarks.fit_more --worker native "$b" \
        --steps "$n" --fraction "$f" --history /tmp/fitdiag-native.pickle > "$OUT/fitdiag-native.json" 2> "$OUT/fitdiag-native.err" &
      env -u PYTORCH_CUDA_ALLOC_CONF MEMALLOC_CONF=expandable_segments:False python3 -m benchmarks.fit_more \
        --worker memalloc "$b" --steps "$n" --fraction "$f" --history /tmp/fitdiag-memalloc.pickle \
        > "$OUT/fitdiag-memalloc.json" 2> "$OUT/fitdiag-memalloc.err" &
      wait
      tail -c 600 "$OUT"/fitdiag-*.json
      for m in native memalloc; do gzip -c /tmp/fitdiag-$m.pickle > "$OUT/fitdiag-$m.pickle.gz"; done
      ls -la "$OUT"/fitdiag-* ;;
    fit)
      python3 -m benchmarks.fit_more --out "$OUT/fit-more.json" --parallel 6 \
        --modes native,expandable,cudaMallocAsync,memalloc,memalloc_plain 2>&1 | tee "$OUT/fit.log" | tail -12 ;;
    planner)
      python3 -m pytest -m gpu -v -rfs tests/gpu/test_cuda_planner.py ${PLANNER_K:+-k "$PLANNER_K"} 2>&1 \
        | tee "$OUT/planner.log" | tail -15
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    steptime)
      python3 -m pytest -m gpu -v -rfs tests/gpu/test_cuda_step_time.py ${STEP_TIME_K:+-k "$STEP_TIME_K"} 2>&1 \
        | tee "$OUT/steptime.log" | tail -15
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    stepab)
      python3 - <<'PY' 2>&1 | tee "$OUT/stepab.log" | tail -5
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests", "gpu"))
from benchmarks.lockstep import pooled
from test_cuda import record
group = os.environ.get("STEPAB_GROUP", "bf16_lockstep")
worker = lambda name: [sys.executable, "-m", "benchmarks.gpu_worker", name, group]
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
          env -u PYTORCH_CUDA_ALLOC_CONF -u MEMALLOC_CONF python3 -m benchmarks.fit_replay_gpu "$snap" "$m" \
            --fraction "${FITDIAG_FRACTION:-0.1107}" > "$OUT/fitreplay-$(basename "$snap" .pickle.gz)-$m.json" &
        done
      done
      wait
      for f in "$OUT"/fitreplay-*.json; do echo "$(basename "$f"): $(cat "$f")"; done
      cat "$OUT"/fitreplay-*.json | python3 -c "import sys,json; [print(json.dumps({'scenario':'fit_replay','mode':d['snapshot']+'/'+d['mode'],'result':d})) for d in map(json.loads, sys.stdin)]" >> "$OUT/gpu_scenarios.jsonl" ;;
    pagemoves)
      w=${PAGEMOVES_WORKLOAD:-gpt2}
      python3 -m benchmarks.record_traces --out "$OUT/traces" --workloads "$w" \
        ${PAGEMOVES_STEPS:+--steps "$PAGEMOVES_STEPS"} ${PAGEMOVES_CONF:+--conf "$PAGEMOVES_CONF"} 2>&1 | tail -3
      python3 -m memalloc replay "$OUT/traces/$w.mtrace.gz" --per-step --config expandable_segments:True \
        --config expandable_segments:True,reuse_free_pages:False --json "$OUT/pagemoves-$w.json" 2>&1 \
        | tee -a "$OUT/pagemoves.log"
      OUT="$OUT" W="$w" python3 -c "import os,json; w=os.environ['W']; d=json.load(open(os.environ['OUT']+f'/pagemoves-{w}.json'))
[print(json.dumps({'scenario':'page_moves','mode':w+'/'+c,'result':rows['0']})) for t in d['per_step'].values() for c, rows in t.items()]" \
        >> "$OUT/gpu_scenarios.jsonl" ;;
    conformance)
      rm -rf /tmp/conformance
      python3 -m benchmarks.conformance --out /tmp/conformance --budget "${CONFORMANCE_BUDGET:-400}" \
        --timeout "${CONFORMANCE_TIMEOUT:-120}" --lanes "${CONFORMANCE_LANES:-cuda:memalloc:default}" \
        ${CONFORMANCE_ONLY:+--only "$CONFORMANCE_ONLY"} 2>&1 | tail -20
      cp /tmp/conformance/conformance.json "$OUT/" ;;
    *) echo "unknown step $what"; exit 2 ;;
  esac
  echo "-- $what took $(( $(date +%s) - start )) s"
  [ -f "$OUT/gpu_scenarios.jsonl" ] && cp "$OUT/gpu_scenarios.jsonl" "$FINAL/"
done
exit $rc
