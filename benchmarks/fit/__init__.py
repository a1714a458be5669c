"""Memory: what fits. The largest batch per allocator under a budget, where
two allocators' request streams part and a stream replayed on the GPU, the
batch planner against a search with real OOMs and its corpus, and the
guide's memory-reducing strategies measured."""
