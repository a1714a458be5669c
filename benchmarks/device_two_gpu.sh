#!/usr/bin/env bash
# Issue 26 in one device call on nvidia-h200-x2 (two GPUs, NCCL):
#   bash benchmarks/device_two_gpu.sh
#   build      the extension
#   dist       tests/gpu/test_cuda_distributed.py: DDP and FSDP2, one rank per GPU,
#              native / memalloc (its default, expandable segments) / memalloc plain (per-rank figures recorded),
#              and the flight recorder's merged report with one rank per GPU
#   compat     tests/gpu/test_compat.py's two-GPU cases (fsdp2, nccl) under the
#              default (expandable segments) and under MEMALLOC_CONF=expandable_segments:False
#   example    examples/ddp.py's NCCL path under memalloc (--ranks 2)
# Results under $OUT: gpu_scenarios.jsonl (every recorded figure) and logs.tgz.
# NVLink multicast stays off (KINDS.md: shared machines).
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
DEVICE_FIGURES="gpu_scenarios.jsonl"
source "$(dirname "$0")/device_out.sh"
rc=0
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))"
echo "== build"
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -60 "$OUT/build.log"; exit 1; }
echo "== dist"
python3 -m pytest -m gpu -v -rfs tests/gpu/test_cuda_distributed.py 2>&1 | tee "$OUT/dist.log" | tail -15
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
echo "== compat (default: expandable segments, then plain segments)"
python3 -m pytest -m gpu -v -rfs tests/gpu/test_compat.py -k "fsdp2 or nccl" 2>&1 | tee "$OUT/compat.log" | tail -5
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
MEMALLOC_CONF=expandable_segments:False python3 -m pytest -m gpu -v -rfs tests/gpu/test_compat.py -k "fsdp2 or nccl" \
  2>&1 | tee "$OUT/compat-plain.log" | tail -5
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
echo "== example"
(cd examples && timeout 300 python3 ddp.py --model transformer --ranks 2) 2>&1 | tee "$OUT/ddp-example.log" | tail -8
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
exit $rc
