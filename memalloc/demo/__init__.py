"""The training script `python -m memalloc demo` hunts a leak in. Files
here count as user code in stacks and leak reports, unlike the rest of the
memalloc package."""
