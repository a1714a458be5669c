"""Time: what allocating costs beside native and memalloc's peers: the GPU suite
and its one-process workers, step times compared in lockstep, growth, the
driver's virtual-memory calls, the private-pool calls of CUDA graph trees."""
