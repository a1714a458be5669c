set -u
export PYTHONPATH=$PWD
t0=$(date +%s)
OUT=$OUT/ab bash benchmarks/device/ab.sh benchmarks/device/ab/no-prefetch.patch 2 python3 -m benchmarks worker memalloc flight_pair 2>&1 | tail -40
echo "ab took $(( $(date +%s) - t0 )) s"
MEMALLOC_GPU_TESTS="tests/gpu/test_cuda_flight.py::test_the_file_backed_ring_costs_within_budget tests/gpu/test_cuda_flight.py::test_a_killed_cuda_process_leaves_every_committed_record" bash benchmarks/device/tests.sh all 2>&1 | grep -E "PASS|FAIL|passed|failed|Error|x_file|assert" | head -30
echo "all took $(( $(date +%s) - t0 )) s"
