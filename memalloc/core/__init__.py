"""Core state: the layer every other folder stands on. Reads the compiled
allocator (memalloc._C) and holds what a process knows about it: the config
text, torch's allocator settings, which allocator is installed, the device
argument, the empty-cache policy, the step counter, the hooks memalloc puts
into torch (each restored on failure), and plain helpers (byte formatting,
the user's code lines). Imports nothing above it (tests/unit/test_layers.py)."""
