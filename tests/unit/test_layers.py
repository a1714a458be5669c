"""The Python package's layers (docs/architecture.md): every import of a
memalloc module goes down the table below, and sits at module level (no
import inside a function to dodge a circle). Reads the source with ``ast``;
needs no build. ``python3 ../shared/tools/import_graph.py memalloc`` checks
the weaker property (no circles).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "memalloc"

# Bottom to top. A module may import only modules of lower layers.
LAYERS: list[tuple[str, ...]] = [
    ("memalloc._C", "memalloc._format", "memalloc._usercode"),  # the extension; plain helpers
    ("memalloc._hooks",),                                        # every hook memalloc installs into torch
    ("memalloc._config", "memalloc.report_html"),                # config text; reporters of plain data
    ("memalloc._settings",),                                     # torch's allocator settings applied
    ("memalloc.leak_report",),                                   # leak report types (plain data)
    ("memalloc._state",),                                        # runtime state (read from _C)
    ("memalloc._device",),                                       # the device argument
    ("memalloc._policy", "memalloc.iteration", "memalloc.host", "memalloc.tags"),
    ("memalloc.recording", "memalloc.phases"),                   # events, stacks; training phases
    ("memalloc.snapshots", "memalloc.trace_files", "memalloc.breakdown"),  # snapshot format; trace files; categories
    ("memalloc.stats", "memalloc.sites", "memalloc.holders"),    # queries; call sites; holder search
    ("memalloc.leaks", "memalloc.oom", "memalloc.tracker", "memalloc.replay", "memalloc.advisor"),  # features
    ("memalloc._torch_patch",),                                  # torch integration (host backend)
    ("memalloc._install",),                                      # enable(): wires every feature
    ("memalloc", "memalloc.pytest_plugin"),                      # the public API
    ("memalloc.examples", "memalloc.examples.leaky_training", "memalloc.cli", "memalloc.cli._common"),
    ("memalloc.cli.demo", "memalloc.cli.info", "memalloc.cli.replay", "memalloc.cli.report", "memalloc.cli.run"),
    ("memalloc.__main__",),
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


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
                problems.append(f"line {node.lineno}: imports {target} (layer {LAYER[target]}) "
                                f"from layer {LAYER[module]}: imports must go down")
    assert not problems, f"{module}:\n  " + "\n  ".join(problems)
