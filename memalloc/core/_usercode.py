"""What counts as the user's code: the one definition used by call sites,
leak reports, OOM holders and ``recording.stack(user_only=True)``.

Not user code: memalloc itself, torch, the standard library and installed
packages (torchvision's layers, transformers' modules), so that a call site
is the user's own line that called into them. memalloc's examples are user
code (they stand for a user's script).
"""
from __future__ import annotations

import linecache
import os
import sysconfig
from typing import Iterable, Optional, Protocol

import torch

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # memalloc/
_EXAMPLES_DIR = os.path.join(_PACKAGE_DIR, "examples") + os.sep
_INTERNAL_DIRS = tuple(os.path.abspath(d) + os.sep for d in {
    _PACKAGE_DIR, os.path.dirname(os.path.abspath(torch.__file__)),
    *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))})


class FrameLike(Protocol):
    filename: str
    line: int
    name: str


def is_internal(filename: str) -> bool:
    """True for a file of memalloc, torch, the standard library or an
    installed package (not memalloc's examples); ``<frozen ...>`` modules too."""
    path = os.path.abspath(filename)
    if path.startswith(_EXAMPLES_DIR):
        return False
    return path.startswith(_INTERNAL_DIRS) or filename.startswith("<frozen")


def user_frame(frames: Iterable[FrameLike]) -> Optional[FrameLike]:
    """The innermost user-code frame; the innermost frame when none is; None
    for no frames."""
    frames = list(frames)
    return next((f for f in frames if not is_internal(f.filename)), frames[0] if frames else None)


def source_line(filename: str, line: int) -> str:
    """The stripped source text of ``filename:line``; "" when unreadable."""
    return linecache.getline(filename, line).strip() if filename and line > 0 else ""
