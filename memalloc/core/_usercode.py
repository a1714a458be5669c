"""What counts as the user's code: the one definition used by call sites,
leak reports, OOM holders and ``recording.stack(user_only=True)``.

Not user code: memalloc itself, torch, the standard library and installed
packages (torchvision's layers, transformers' modules), so that a call site
is the user's own line that called into them. memalloc's demo script
(memalloc/demo/) is user code: it stands for a user's script.
"""

from __future__ import annotations

import linecache
import os
import sysconfig
import zipfile
from collections.abc import Iterable
from typing import Protocol, TypeVar

import torch

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # memalloc/
_DEMO_DIR = os.path.join(_PACKAGE_DIR, "demo") + os.sep
_INTERNAL_DIRS = tuple(
    os.path.abspath(d) + os.sep
    for d in {
        _PACKAGE_DIR,
        os.path.dirname(os.path.abspath(torch.__file__)),
        *(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
)


class FrameLike(Protocol):
    """A frame as user_frame reads it (read-only: recording.Frame is frozen)."""

    @property
    def filename(self) -> str: ...

    @property
    def line(self) -> int: ...

    @property
    def name(self) -> str: ...


_Frame = TypeVar("_Frame", bound=FrameLike)


def is_internal(filename: str) -> bool:
    """True for a file of memalloc, torch, the standard library or an
    installed package (not memalloc's demo script); ``<frozen ...>`` modules too."""
    path = os.path.abspath(filename)
    if path.startswith(_DEMO_DIR):
        return False
    return path.startswith(_INTERNAL_DIRS) or filename.startswith("<frozen")


def user_frame(frames: Iterable[_Frame]) -> _Frame | None:
    """The innermost user-code frame; the innermost frame when none is; None
    for no frames."""
    frames = list(frames)
    return next((f for f in frames if not is_internal(f.filename)), frames[0] if frames else None)


def source_line(filename: str, line: int) -> str:
    """The stripped source text of ``filename:line``, wherever Python can
    find it: a file, an IPython/Jupyter cell (IPython registers its cells in
    linecache), a module imported from a zip archive. Where it cannot, why,
    in parentheses ("(no source: code given to python -c or exec() has no
    file)"). "" for no filename or line."""
    if not filename or line <= 0:
        return ""
    text = linecache.getline(filename, line)
    if not text and load_zip_source(filename):
        text = linecache.getline(filename, line)
    return text.strip() if text else f"({NO_SOURCE}: {_why_no_source(filename, line)})"


NO_SOURCE = "no source"  # how source_line() begins the reason it has no line


def is_source(code: str) -> bool:
    """Whether a source_line() result is source text (not "" nor the reason
    there is none)."""
    return bool(code) and not code.startswith(f"({NO_SOURCE}:")


def _zip_member(filename: str) -> tuple[str, str] | None:
    """(archive, member) of a path inside a zip archive, or None."""
    head, sep, member = filename.partition(".zip" + os.sep)
    return (head + ".zip", member.replace(os.sep, "/")) if sep and os.path.isfile(head + ".zip") else None


def load_zip_source(filename: str) -> bool:
    """Reads a module's source out of its zip archive into linecache (a
    zipimported module's frames name "<archive>.zip/<member>", which
    linecache cannot open without the module's globals)."""
    found = _zip_member(filename)
    if found is None:
        return False
    try:
        with zipfile.ZipFile(found[0]) as z:
            source = z.read(found[1]).decode("utf-8", errors="replace")
    except (OSError, KeyError, zipfile.BadZipFile):
        return False
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    return True


def _why_no_source(filename: str, line: int) -> str:
    if filename == "<string>":
        return "code given to python -c or exec() has no file"
    if filename == "<stdin>":
        return "code typed at the interpreter prompt or piped to python"
    if filename.startswith("<ipython-input-") or "ipykernel_" in filename:
        return "an IPython cell that is not in this session's history"
    if filename.startswith("<"):
        return f"{filename} is not a file"
    if os.path.exists(filename) or _zip_member(filename):
        return f"{filename} has no line {line} (changed since it ran?)"
    return f"{filename} is not found"
