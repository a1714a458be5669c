"""Build of memalloc's C++ core (memalloc._C) with torch.utils.cpp_extension.

cpp_extension is needed because the allocator throws c10::OutOfMemoryError
(which torch turns into torch.OutOfMemoryError). Only csrc/boundary/ includes
torch or Python headers; csrc/*.cpp is plain C++17.
Install with `pip install --no-build-isolation -e .` so the build uses the
torch already installed (a build-isolated one would download another).
"""
import glob
import os

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
# csrc/*.cpp is the core (plain C++17, no torch, no Python); csrc/boundary/
# holds the files that talk to torch and Python (pluggable entry points,
# bindings, Python stack capture).
SOURCES = sorted(os.path.relpath(p, HERE) for pattern in ("csrc/*.cpp", "csrc/boundary/*.cpp")
                 for p in glob.glob(os.path.join(HERE, pattern)))

setup(
    packages=find_packages(include=["memalloc", "memalloc.*"]),
    ext_modules=[
        CppExtension(
            "memalloc._C",
            SOURCES,
            include_dirs=[os.path.join(HERE, "csrc")],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            libraries=["dl"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
