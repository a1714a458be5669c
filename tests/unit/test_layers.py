"""The layers (docs/architecture.md), read from the source: every import of a
memalloc module goes down the table below, and sits at module level (no
import inside a function to dodge a circle). Reads the source with ``ast``;
needs no build. ``python3 ../shared/tools/import_graph.py memalloc`` checks
the weaker property (no circles). The same for csrc/: every #include of a
memalloc header names its path from csrc/ and goes down the folders' layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "memalloc"

# The folders of memalloc/, bottom to top, each with its layers bottom to top.
# A module may import only modules of lower layers: a folder imports only
# from itself (lower layers of it) and the folders below. The package's own
# files (memalloc._C, the public API, the pytest plugin, __main__) are the
# bands named "" at the foot and the top.
FOLDERS: list[tuple[str, list[tuple[str, ...]]]] = [
    ("", [("memalloc._C",)]),  # the extension
    (
        "core",
        [
            (
                "memalloc.core",
                "memalloc.core._format",
                "memalloc.core._usercode",
                "memalloc.core._checks",
            ),  # plain helpers
            ("memalloc.core._hooks",),  # every hook memalloc installs into torch
            ("memalloc.core._config",),  # config text
            ("memalloc.core._settings",),  # torch's allocator settings applied
            ("memalloc.core._state",),  # runtime state (read from _C)
            ("memalloc.core._device",),  # the device argument
            ("memalloc.core._policy", "memalloc.core.iteration"),  # empty-cache policy; the step
        ],
    ),
    (
        "reporters",
        [
            ("memalloc.reporters", "memalloc.reporters.report_html"),  # HTML of a plain report
            ("memalloc.reporters.notebook",),  # notebook HTML (_repr_html_) of plain data
            (
                "memalloc.reporters.leak_report",
                "memalloc.reporters.flight",
                "memalloc.reporters.steps",
                "memalloc.reporters.advice",
                "memalloc.reporters.replay",
                "memalloc.reporters.plan",
                "memalloc.reporters.diff",
            ),  # leak report types; renderings of plain data (features and trace delegate down to them)
            ("memalloc.reporters.run_page",),  # the run page: the notebook's fragments and its own charts
        ],
    ),
    (
        "trace",
        [
            ("memalloc.trace", "memalloc.trace.tags"),  # stack tags
            ("memalloc.trace.recording",),  # events of the ring, stacks
            (
                "memalloc.trace.snapshots",
                "memalloc.trace.trace_files",
                "memalloc.trace.sites",
                "memalloc.trace.flight_files",
            ),  # exports; the flight recorder's file
            ("memalloc.trace.flight_report",),  # a job's flight files merged
            ("memalloc.trace.diff",),  # two runs compared by line
            ("memalloc.trace.run_page",),  # one page per run, from its flight file and reports
        ],
    ),
    (
        "features",
        [
            ("memalloc.features", "memalloc.features.phases"),  # training landmarks
            ("memalloc.features.breakdown",),  # bytes by category
            ("memalloc.features.stats", "memalloc.features.holders"),  # queries; holder search
            (
                "memalloc.features.leaks",
                "memalloc.features.oom",
                "memalloc.features.tracker",
                "memalloc.features.replay",
                "memalloc.features.advisor",
            ),
            (
                "memalloc.features.flight",
                "memalloc.features.planner",
            ),  # the flight recorder; the batch planner (replays)
        ],
    ),
    (
        "install",
        [
            (
                "memalloc.install",
                "memalloc.install.host",
                "memalloc.install._torch_patch",
            ),  # torch tensors; torch.cuda patch
            ("memalloc.install._install",),  # enable(): wires every feature
        ],
    ),
    ("", [("memalloc.errors",)]),  # every exception, gathered
    ("", [("memalloc", "memalloc.pytest_plugin")]),  # the public API
    (
        "integrations",
        [
            ("memalloc.integrations", "memalloc.integrations._monitor"),  # the callbacks' shared trackers
            ("memalloc.integrations.lightning", "memalloc.integrations.transformers"),  # one per framework
        ],
    ),
    ("demo", [("memalloc.demo", "memalloc.demo.leaky_training")]),  # the demo's script (user code)
    (
        "cli",
        [
            ("memalloc.cli", "memalloc.cli._common", "memalloc.cli.fit"),
            (
                "memalloc.cli.demo",
                "memalloc.cli.info",
                "memalloc.cli.replay",
                "memalloc.cli.report",
                "memalloc.cli.run",
                "memalloc.cli.postmortem",
                "memalloc.cli.top",
                "memalloc.cli.diff",
            ),
        ],
    ),
    ("", [("memalloc.__main__",)]),
]
LAYERS: list[tuple[str, ...]] = [layer for _, layers in FOLDERS for layer in layers]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}
PACKAGES = {f"memalloc.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """memalloc modules an import statement names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "memalloc"]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level == 0:
        base = node.module or ""
        if base.split(".")[0] != "memalloc":
            return []
    else:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    out = []
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        out.append(candidate if candidate in LAYER else base)
    return out


def sources():
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_each_folder_holds_the_modules_of_its_band():
    """A module listed under folder F lives in memalloc/F/ (and a module of
    memalloc/ itself in a band named ""): the folders are the layers."""
    wrong = []
    for folder, layers in FOLDERS:
        for name in (n for layer in layers for n in layer):
            parts = name.split(".")[1:]
            where = parts[0] if len(parts) > 1 or (parts and name in PACKAGES) else ""
            if where != folder:
                wrong.append(f"{name} is listed under {folder!r} but lives in {where!r}")
    assert not wrong, wrong


def test_every_module_has_a_layer():
    missing = [module_name(p) for p in sources() if module_name(p) not in LAYER]
    assert not missing, f"place these modules in LAYERS (tests/unit/test_layers.py): {missing}"


@pytest.mark.parametrize("path", sources(), ids=lambda p: module_name(p))
def test_imports_go_down_and_sit_at_module_level(path):
    module = module_name(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = set(map(id, tree.body))
    problems = []
    for node in ast.walk(tree):
        for target in imported(node, module, path.name == "__init__.py"):
            if id(node) not in top_level:
                problems.append(f"line {node.lineno}: imports {target} inside a function or class")
            if target not in LAYER:
                problems.append(f"line {node.lineno}: imports {target}, which has no layer")
            elif LAYER[target] >= LAYER[module]:
                problems.append(
                    f"line {node.lineno}: imports {target} (layer {LAYER[target]}) "
                    f"from layer {LAYER[module]}: imports must go down"
                )
    assert not problems, f"{module}:\n  " + "\n  ".join(problems)


# The C++ folders of csrc/, bottom to top (docs/architecture.md): the core
# (common/ .. allocator/) is an allocator and knows nothing of who allocates;
# profiler/ (provenance, the breakdown, the event ring, stacks) subscribes to
# its Events (allocator/subscriber.h); process/ joins each device's allocator
# to its profiler and holds the one global. A file includes only headers of
# its own folder and of the folders below it.
# boundary/, the only folder that includes torch or Python headers, is
# layered by its sub-folders: callers/ (who is calling: Python frames and
# stacks), then torch/ (torch's interfaces; torch/cuda/ with it), then
# python/ (the module memalloc._C, which binds them all).
CSRC = PACKAGE.parent / "csrc"
CSRC_LAYERS: list[tuple[str, ...]] = [
    ("common",),
    ("backend",),
    ("pool",),
    ("accounting",),
    ("allocator",),
    ("profiler",),
    ("process",),
    ("boundary/callers",),
    ("boundary/torch",),
    ("boundary/python",),
]
CSRC_LAYER = {folder: i for i, folders in enumerate(CSRC_LAYERS) for folder in folders}


def csrc_files():
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".h", ".cpp"))


def csrc_folder(parts: tuple[str, ...] | list[str]) -> str:
    """The layer's name of a path from csrc/: its folder, or boundary/ and
    its sub-folder."""
    return "/".join(parts[:2]) if parts[0] == "boundary" and len(parts) > 2 else parts[0]


def test_every_csrc_folder_has_a_layer():
    folders = {csrc_folder(p.relative_to(CSRC).parts) for p in csrc_files()}
    assert folders == set(CSRC_LAYER), f"csrc/ folders without a layer: {folders ^ set(CSRC_LAYER)}"
    assert not [p for p in csrc_files() if len(p.relative_to(CSRC).parts) == 1], "csrc/ keeps files only in folders"
    assert not [
        p for p in csrc_files() if p.relative_to(CSRC).parts[0] == "boundary" and len(p.relative_to(CSRC).parts) == 2
    ], "csrc/boundary/ keeps files only in its sub-folders"


@pytest.mark.parametrize("path", csrc_files(), ids=lambda p: str(p.relative_to(CSRC)))
def test_csrc_includes_go_down(path):
    folder = csrc_folder(path.relative_to(CSRC).parts)
    problems = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith('#include "'):
            target = stripped.split('"')[1]
            top = csrc_folder(target.split("/"))
            if "/" not in target or top not in CSRC_LAYER:
                problems.append(f'line {n}: {target!r} is not a path from csrc/ ("pool/block.h")')
            elif CSRC_LAYER[top] > CSRC_LAYER[folder]:
                problems.append(
                    f"line {n}: includes {target} (layer {CSRC_LAYER[top]}) from layer "
                    f"{CSRC_LAYER[folder]}: includes must go down"
                )
        elif stripped.startswith("#include <") and not folder.startswith("boundary/"):
            header = stripped[len("#include <") :].split(">")[0]
            if header.split("/")[0] in ("torch", "c10", "ATen", "pybind11", "Python.h", "cuda.h", "cuda_runtime_api.h"):
                problems.append(f"line {n}: <{header}> outside csrc/boundary/")
    assert not problems, f"{path.relative_to(CSRC)}:\n  " + "\n  ".join(problems)
