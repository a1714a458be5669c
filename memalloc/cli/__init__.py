"""One module per ``python -m memalloc`` command."""
