"""The scripts a GPU machine runs, each in one device call (tests.sh: the GPU
test suite; steps.sh: benchmark and test steps; ab.sh: an A/B of a patch;
out.sh: what they share), and collect.py, which joins a run's junit files
and figures into the results file committed under benchmarks/results/."""
