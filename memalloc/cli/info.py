"""``python -m memalloc info``: which backend ``enable()`` would pick, and the config keys."""

from __future__ import annotations

import argparse

import torch

from memalloc import _C
from memalloc.core._config import config_text
from memalloc.core._state import cuda_usable, resolve_backend


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="show the backend enable() would choose and the config")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        text = config_text()
    except ValueError as e:
        raise SystemExit(f"memalloc: {e}") from None
    ok, why = cuda_usable()
    print(f"torch {torch.__version__}; CUDA usable: {'yes' if ok else 'no (' + why + ')'}")
    print(f"enable() would use the {resolve_backend('auto', text)} backend")
    print(f"config: {text}")
    print(f"config keys: {', '.join(_C.config_keys())}")
    return 0
