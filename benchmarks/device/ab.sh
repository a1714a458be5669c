#!/usr/bin/env bash
# A/B of a change on the device, in one call: this tree (A) against a copy
# with PATCH applied (B), both built, then COMMAND run in fresh processes in
# each tree alternately, A B B A ..., ROUNDS times each (the machine's speed
# drifts between processes: ABBA keeps either side from always running on a
# warmer one). COMMAND prints one JSON object as its last line (as
# benchmarks/speed/worker.py does); every process's object, and per numeric key
# the median over each side's processes and the ratio B/A of those medians,
# go to $OUT/ab.json.
#
#   OUT=dir bash benchmarks/device/ab.sh PATCH ROUNDS COMMAND...
#   e.g. bash benchmarks/device/ab.sh benchmarks/device/ab/no-prefetch.patch 2 \
#            python3 -m benchmarks worker memalloc flight
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: OUT=dir bash benchmarks/device/ab.sh PATCH ROUNDS COMMAND..." >&2
  exit 2
fi
PATCH=$(realpath "$1"); ROUNDS=$2; shift 2
OUT=${OUT:-/tmp/memalloc-ab}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
A=$PWD
B=$(mktemp -d)/b
cp -a "$A" "$B"
(cd "$B" && { git apply "$PATCH" 2>/dev/null || patch -p1 --quiet < "$PATCH"; }) ||
  { echo "device/ab.sh: $PATCH does not apply to this tree" >&2; exit 2; }
for side in A B; do
  tree=$A; [ $side = B ] && tree=$B
  (cd "$tree" && python3 setup.py build_ext --inplace > "$OUT/build-$side.log" 2>&1) ||
    { echo "device/ab.sh: the $side build failed:" >&2; tail -30 "$OUT/build-$side.log" >&2; exit 1; }
done
python3 - "$A" "$B" "$ROUNDS" "$OUT/ab.json" "$PATCH" "$@" <<'PY'
import json, os, statistics, subprocess, sys
a, b, rounds, out, patch, *command = sys.argv[1:]
runs = {"A": [], "B": []}
for r in range(int(rounds)):
    for side in (("A", "B") if r % 2 == 0 else ("B", "A")):
        tree = a if side == "A" else b
        p = subprocess.run(command, cwd=tree, env=dict(os.environ, PYTHONPATH=tree), capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"device/ab.sh: {side} process {r} failed ({p.returncode}):\n{p.stderr[-3000:]}")
        runs[side].append(json.loads(p.stdout.strip().splitlines()[-1]))
        print(side, r, flush=True)
keys = [k for k, v in runs["A"][0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
medians = {s: {k: statistics.median(x[k] for x in runs[s]) for k in keys} for s in runs}
ratios = {k: medians["B"][k] / medians["A"][k] for k in keys if medians["A"][k]}
json.dump({"patch": patch, "command": command, "rounds": int(rounds), "order": "ABBA",
           "medians": medians, "b_over_a": ratios, "runs": runs}, open(out, "w"), indent=1)
for k in keys:
    print(f"{k:50} A {medians['A'][k]:.6g}  B {medians['B'][k]:.6g}  B/A {ratios.get(k, float('nan')):.4f}")
PY
