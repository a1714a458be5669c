"""The one builder of the standalone C++ core: every csrc/ folder but
boundary/ (common, backend, pool, accounting, recorder, allocator) compiled
with a C++17 compiler, without torch or Python (csrc/boundary/ needs both and
stays out),
linked with a driver program into an executable.

Used by benchmarks/cpu/suite.py (bench_core, whose callgrind figures are
gated), tests/cpp/test_cpp_core.py (steady_state) and tests/cpp/test_sanitizers.py
(stress, once per sanitizer flavor).

    exe = build_executable("stress", [Path("tests/cpp/stress.cpp")], out_dir,
                           flags=["-std=c++17", "-O1", "-fsanitize=thread"]).binary

Invariants:
- The compiler is $CXX when set, else g++, else c++ (find_compiler); none
  found is a BuildError that says what to install or set.
- Each source (the core first, in sorted order, then the extra sources in the
  order given) is compiled on its own, in parallel, with exactly
  ``cxx *flags *compile_flags -I csrc -c SRC -o OBJ``, and the objects are
  linked in that same order with ``cxx *flags OBJS *libs -o BINARY``. Nothing
  else is added (no -march, no optimisation of its own): the caller's flags
  alone decide the code, so instruction counts depend on them only.
- Executable NAME goes to out_dir/NAME, its objects to out_dir/NAME.objs/,
  and the fingerprint of its inputs to out_dir/NAME.fingerprint. The
  fingerprint (sha256) covers the compiler path and version, every flag, and
  the content of every core header (csrc/**/*.h outside boundary/), every core source, each extra source and the
  *.h files beside it. When it matches and the executable exists, nothing is
  compiled (Built.cached); rebuild=True compiles anyway. The fingerprint is
  written only after a successful link.
- A failed compile or link raises BuildError, whose message names the step
  and whose ``output`` is what the compiler printed. Built.warnings is all the
  compiler and linker printed on a successful build ("" when cached).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "csrc"
DEFAULT_LIBS = ("-ldl",)  # the CUDA driver backend (backend_cuda.cpp) is loaded with dlopen
COMMAND_TIMEOUT_S = 600.0  # one compile or link
PathLike = str | Path


class BuildError(RuntimeError):
    """The core could not be built; ``output`` is what the compiler printed."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


@dataclass(frozen=True)
class Built:
    binary: Path
    compiler: str
    compiler_version: str
    cached: bool  # True: the fingerprint matched, nothing was compiled
    seconds: float  # compile + link wall time (0.0 when cached)
    warnings: str  # what the compiler and linker printed ("" when cached)


def _in_core(path: Path) -> bool:
    return path.relative_to(CSRC).parts[0] != "boundary"


def core_sources() -> list[Path]:
    """The core's translation units (csrc/**/*.cpp outside boundary/), sorted."""
    return sorted(p for p in CSRC.rglob("*.cpp") if _in_core(p))


def find_compiler() -> str:
    """$CXX when set, else g++, else c++, as a path; BuildError naming the fix."""
    cxx = os.environ.get("CXX")
    if cxx:
        found = shutil.which(cxx)
        if not found:
            raise BuildError(f"CXX={cxx!r} is not an executable compiler: set CXX to one (e.g. g++) or unset it")
        return found
    found = shutil.which("g++") or shutil.which("c++")
    if not found:
        raise BuildError(
            "no C++ compiler found (tried $CXX, g++, c++): install g++ "
            "(apt-get install -y g++) or set CXX to a C++17 compiler"
        )
    return found


def compiler_version(cxx: str) -> str:
    """The first line of ``cxx --version`` ("unknown" when it prints nothing)."""
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0].strip() if out else "unknown"


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _run(cmd: Sequence[str], what: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"{what}: no result within {COMMAND_TIMEOUT_S:.0f} s", str(e.stderr or "")) from None


def _fingerprint(cxx: str, version: str, flag_groups: Sequence[Sequence[str]], sources: Sequence[Path]) -> str:
    h = hashlib.sha256(json.dumps([cxx, version, *[list(g) for g in flag_groups]]).encode())
    inputs = sorted(p for p in CSRC.rglob("*.h") if _in_core(p)) + list(sources)
    for directory in sorted({s.parent for s in sources if not s.is_relative_to(CSRC)}):
        inputs += sorted(directory.glob("*.h"))
    for p in inputs:
        h.update(_display(p).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def build_executable(
    name: str,
    extra_sources: Sequence[PathLike],
    out_dir: PathLike,
    flags: Sequence[str],
    *,
    compile_flags: Sequence[str] = (),
    libs: Sequence[str] = DEFAULT_LIBS,
    rebuild: bool = False,
    jobs: int | None = None,
) -> Built:
    """Compiles the core plus extra_sources (one of them defines main) into
    out_dir/name. ``flags`` go to every compile and to the link,
    ``compile_flags`` (warnings, say) to the compiles only, ``libs`` after the
    objects at the link. ``jobs`` compiles at a time (default: one per CPU)."""
    out_dir = Path(out_dir)
    sources = core_sources() + [Path(s).resolve() for s in extra_sources]
    stems = [s.stem for s in sources]
    if len(set(stems)) != len(stems):
        raise BuildError(f"two sources of {name} share a file name: {sorted(stems)}")
    cxx = find_compiler()
    version = compiler_version(cxx)
    binary = out_dir / name
    stamp = out_dir / f"{name}.fingerprint"
    fp = _fingerprint(cxx, version, [flags, compile_flags, libs], sources)
    if not rebuild and binary.exists() and stamp.exists() and stamp.read_text() == fp:
        return Built(binary, cxx, version, cached=True, seconds=0.0, warnings="")

    t0 = time.monotonic()
    stamp.unlink(missing_ok=True)
    obj_dir = out_dir / f"{name}.objs"
    obj_dir.mkdir(parents=True, exist_ok=True)
    objs = [obj_dir / (s.stem + ".o") for s in sources]

    def compile_one(job: tuple[Path, Path]) -> subprocess.CompletedProcess:
        src, obj = job
        return _run(
            [cxx, *flags, *compile_flags, "-I", str(CSRC), "-c", str(src), "-o", str(obj)], f"compiling {_display(src)}"
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        results = list(pool.map(compile_one, zip(sources, objs)))
    for src, r in zip(sources, results):
        if r.returncode != 0:
            raise BuildError(
                f"compiling {_display(src)} with {' '.join([*flags, *compile_flags])} failed:\n{r.stderr[-4000:]}",
                r.stderr,
            )
    r = _run([cxx, *flags, *map(str, objs), *libs, "-o", str(binary)], f"linking {name}")
    if r.returncode != 0:
        raise BuildError(f"linking {name} failed:\n{r.stderr[-4000:]}", r.stderr)
    stamp.write_text(fp)
    warnings = ("".join(res.stderr for res in results) + r.stderr).strip()
    return Built(binary, cxx, version, cached=False, seconds=round(time.monotonic() - t0, 2), warnings=warnings)


def probe(flags: Sequence[str], work_dir: PathLike) -> str | None:
    """None when the compiler builds and links a hello-world with ``flags``
    (a sanitizer's runtime is there, say); else what the compiler printed."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    tag = hashlib.sha1(" ".join(flags).encode()).hexdigest()[:12]
    src = work_dir / f"probe_{tag}.cpp"
    src.write_text('#include <cstdio>\nint main() { std::puts("hello"); return 0; }\n')
    r = _run([find_compiler(), *flags, str(src), "-o", str(work_dir / f"probe_{tag}")], "probing " + " ".join(flags))
    return None if r.returncode == 0 else r.stderr
