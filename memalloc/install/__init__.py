"""Installing memalloc into torch: as torch's allocator (enable), the
host backend's torch tensors (host), and the torch.cuda patch that answers
through memalloc without a GPU. (The pytest plugin is memalloc/pytest_plugin.py:
pytest loads it by that name.)"""
