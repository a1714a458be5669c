"""Build of memalloc's C++ core (memalloc._C) with torch.utils.cpp_extension.

cpp_extension is needed because the allocator throws c10::OutOfMemoryError
(which torch turns into torch.OutOfMemoryError). Only csrc/boundary/ includes
torch or Python headers; the core (every other folder of csrc/) is plain C++17.
Every #include names its path from csrc/ ("pool/block.h").
Install with `pip install --no-build-isolation -e .` so the build uses the
torch already installed (a build-isolated one would download another).

What a build contains:
  * always: the core and the host backend, the CUDA driver backend (loaded
    with dlopen at run time), the Python bindings, and the C entry points
    for torch.cuda.memory.CUDAPluggableAllocator;
  * when the installed torch has CUDA (torch.version.cuda is set):
    csrc/boundary/torch/cuda/, the subclass of torch's CUDAPluggableAllocator that
    memalloc.enable() installs (needs libtorch_cuda and CUDA's headers, which
    come from $CUDA_HOME or the nvidia-cuda-runtime wheel). MEMALLOC_NO_CUDA=1
    leaves it out.
"""

import glob
import os
import shutil

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))


def sources(*patterns: str) -> list[str]:
    return sorted(
        os.path.relpath(p, HERE) for pattern in patterns for p in glob.glob(os.path.join(HERE, pattern), recursive=True)
    )


def cuda_include_dirs() -> list[str]:
    """Directories holding cuda_runtime_api.h: $CUDA_HOME (or /usr/local/cuda),
    the toolkit of the nvcc on PATH, or the nvidia-cuda-runtime wheel."""
    candidates = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include"))
    try:
        import nvidia.cuda_runtime  # type: ignore[import-not-found]

        candidates += [os.path.join(p, "include") for p in nvidia.cuda_runtime.__path__]
    except ImportError:
        pass
    return [d for d in candidates if os.path.exists(os.path.join(d, "cuda_runtime_api.h"))][:1]


# Every csrc/ folder but boundary/ is the core (plain C++17, no torch, no
# Python; docs/architecture.md); csrc/boundary/ holds the files that talk to
# Python (python/) and torch (torch/; its cuda/ folder only with a CUDA torch).
CUDA_PART = os.path.join("csrc", "boundary", "torch", "cuda")
SOURCES = [s for s in sources("csrc/**/*.cpp") if not s.startswith(CUDA_PART + os.sep)]
INCLUDES = [os.path.join(HERE, "csrc")]
LIBRARIES = ["dl"]
# The torch built against: CUDA IPC handles are written in its own version
# of the wire format (csrc/boundary/torch/ipc_wire.h).
_TORCH_MAJOR, _TORCH_MINOR = (int(x) for x in torch.__version__.split(".")[:2])
MACROS = [("MEMALLOC_TORCH_MAJOR", str(_TORCH_MAJOR)), ("MEMALLOC_TORCH_MINOR", str(_TORCH_MINOR))]
WITH_TORCH_CUDA = torch.version.cuda is not None and os.environ.get("MEMALLOC_NO_CUDA") != "1"
if WITH_TORCH_CUDA:
    cuda_includes = cuda_include_dirs()
    if not cuda_includes:
        raise RuntimeError(
            "this torch has CUDA but no cuda_runtime_api.h was found: set CUDA_HOME, "
            "`pip install nvidia-cuda-runtime`, or build without the CUDA part (MEMALLOC_NO_CUDA=1)"
        )
    SOURCES += sources("csrc/boundary/torch/cuda/*.cpp")
    INCLUDES += cuda_includes
    LIBRARIES += ["c10_cuda", "torch_cuda"]
    MACROS += [("MEMALLOC_WITH_TORCH_CUDA", "1")]

setup(
    packages=find_packages(include=["memalloc", "memalloc.*"]),
    ext_modules=[
        CppExtension(
            "memalloc._C",
            SOURCES,
            include_dirs=INCLUDES,
            define_macros=MACROS,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            libraries=LIBRARIES,
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
