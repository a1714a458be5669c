"""A training-like loop for tests/integration/test_flight_recorder.py, run as
``python flight_loop.py MODE DIR RECORDS [BACKEND]``: on the host backend with
torch's CPU tensors allocated by memalloc (BACKEND "cuda": on the GPU), 30 steps, each allocating a batch of a
varying size and keeping one 16 KiB tensor (the leak). MODE: "kill"
(SIGKILL itself after step 20), "segv" (a segfault there), "clean" (returns),
"memory" (no flight recorder: the in-memory ring, written to DIR/ring.bin at
step 20, as the truth a killed run's file is compared with).
"""

import os
import signal
import sys

import torch

import memalloc

mode, directory, records = sys.argv[1], sys.argv[2], int(sys.argv[3])
backend = sys.argv[4] if len(sys.argv) > 4 else "host"
recorder = "" if mode == "memory" else f",flight_recorder:{directory}"
keep = ",flight_recorder_keep:True" if mode == "keep" else ""
memalloc.enable(backend=backend, config=f"host_capacity_mb:256,record_history:{records}{recorder}{keep}")
if backend == "host":
    memalloc.host.use_for_cpu_tensors()
device = "cpu" if backend == "host" else "cuda"
kept = []
for step in range(30):
    batch = torch.ones(1024 * (step % 5 + 1), device=device)
    kept.append(torch.ones(4096, device=device))  # KEEP-LINE
    memalloc.step()
    if step == 20:
        if mode == "memory":
            raw, _dropped = memalloc.recording.raw_records(0)
            with open(os.path.join(directory, "ring.bin"), "wb") as f:
                f.write(raw)
        elif mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif mode == "segv":
            import ctypes

            ctypes.string_at(0)
print("clean end", flush=True)
