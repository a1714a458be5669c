# The prefetch A/B in the full flight group (the pairs measured between bf16
# steps, as test_the_file_backed_ring_costs_within_budget measures them):
# A = this tree (prefetch), B = without it.
set -u
export PYTHONPATH=$PWD
t0=$(date +%s)
OUT=$OUT/ab bash benchmarks/device/ab.sh benchmarks/device/ab/no-prefetch.patch 2 python3 -m benchmarks worker memalloc flight 2>&1 | grep -v "_all" | tail -40
echo "ab took $(( $(date +%s) - t0 )) s"
