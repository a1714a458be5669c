"""torch's CUDA allocator interface against memalloc's subclass: which virtual
methods of ``c10::cuda::CUDACachingAllocator::CUDAAllocator`` (and of its bases
``c10::DeviceAllocator`` and ``c10::Allocator``) memalloc overrides, which it
inherits on purpose (the list in csrc/boundary/torch/cuda/torch_allocator.h,
each with its reason), and which are missing: read from the installed torch's
headers (the CPU wheel ships them too) and memalloc's own source.

``python -m benchmarks.compat.interface [--json]`` prints the table for the torch
in use; tests/contract/test_torch_interface.py fails on any missing method,
and benchmarks/compat/matrix.py records the table per torch version.

The reader is a small C++ declaration parser, not a compiler: comments and
string literals are dropped, ``#if`` blocks are evaluated with torch's version
macros (``TORCH_VERSION_MAJOR``/``MINOR``, memalloc's ``MEMALLOC_TORCH_AT_LEAST``),
and a class body is split into declarations at its top level (nested types,
function bodies and brace initialisers skipped). A method's key is its name,
its parameter types with names, defaults and namespace qualifiers dropped, and
``const`` (what decides an override in C++).

Invariants:
  * A method is virtual when a class of the chain declares it ``virtual``,
    ``override`` or ``final``; destructors are left out.
  * An unknown macro in a ``#if`` of memalloc's source is an error (the answer
    would be a guess); in torch's headers it is 0, as the preprocessor has it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUBCLASS_SOURCE = REPO / "csrc" / "boundary" / "torch" / "cuda" / "torch_allocator.cpp"
SUBCLASS_HEADER = REPO / "csrc" / "boundary" / "torch" / "cuda" / "torch_allocator.h"
SUBCLASS = "TorchCudaAllocator"
# (header under torch/include, class): the interface, base first.
CHAIN = (
    ("c10/core/Allocator.h", "Allocator"),
    ("c10/core/CachingDeviceAllocator.h", "DeviceAllocator"),
    ("c10/cuda/CUDACachingAllocator.h", "CUDAAllocator"),
)
PLUGGABLE = ("torch/csrc/cuda/CUDAPluggableAllocator.h", "CUDAPluggableAllocator")
BUILTIN_WORDS = {"int", "long", "short", "char", "unsigned", "signed", "double", "float", "bool", "void", "auto"}
QUALIFIERS = {"const", "volatile", "struct", "class", "typename", "enum"}


class ParseError(ValueError):
    """The text is not what the reader can read (a class not found, an unknown macro)."""


@dataclass(frozen=True)
class Method:
    name: str
    params: tuple[str, ...]  # normalised types
    const: bool
    virtual: bool  # declared virtual, override or final
    pure: bool  # = 0
    final: bool
    declares_override: bool

    @property
    def key(self) -> str:
        return f"{self.name}({','.join(self.params)})" + (" const" if self.const else "")


# ---- text: comments, strings, preprocessor ---------------------------------------


def strip_comments(text: str) -> str:
    """The text with comments replaced by a space and string/char literals
    emptied (their delimiters kept); newlines kept so ``#`` lines stay lines."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            out.append(" ")
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            end = n if j < 0 else j + 2
            out.append(" " + "\n" * text.count("\n", i, end))
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _condition(expr: str, macros: dict[str, int], strict: bool) -> bool:
    """A ``#if`` expression of integers, macros, ``defined``, comparisons and
    ``&& || !``, evaluated as the preprocessor does."""

    def at_least(m: re.Match[str]) -> str:
        major, minor = int(m.group(1)), int(m.group(2))
        have = (macros.get("TORCH_VERSION_MAJOR", 0), macros.get("TORCH_VERSION_MINOR", 0))
        return "1" if have >= (major, minor) else "0"

    e = re.sub(r"MEMALLOC_TORCH_AT_LEAST\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)", at_least, expr)
    e = re.sub(
        r"defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+)", lambda m: "1" if (m.group(1) or m.group(2)) in macros else "0", e
    )

    def name(m: re.Match[str]) -> str:
        word = m.group(0)
        if word in macros:
            return str(macros[word])
        if strict:
            raise ParseError(f"#if uses {word}, which this reader does not know: {expr.strip()}")
        return "0"

    e = re.sub(r"\b[A-Za-z_]\w*\b", name, e)
    e = e.replace("&&", " and ").replace("||", " or ")
    e = re.sub(r"!(?!=)", " not ", e)
    if not re.fullmatch(r"[\d\s()<>=!notandr]*", e):
        raise ParseError(f"#if expression not understood: {expr.strip()}")
    return bool(eval(e, {"__builtins__": {}}, {}))  # digits, comparisons and and/or/not only (checked above)


def preprocess(text: str, macros: dict[str, int], strict: bool = False) -> str:
    """Comment-free text with ``#if``/``#ifdef``/``#ifndef``/``#elif``/``#else``/``#endif``
    applied and every other directive dropped."""
    lines = strip_comments(text).replace("\\\n", " ").split("\n")
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (this branch live, some branch taken)
    live = True
    for line in lines:
        m = re.match(r"\s*#\s*(\w+)(.*)", line)
        if not m:
            out.append(line if live else "")
            continue
        word, rest = m.group(1), m.group(2)
        if word in ("if", "ifdef", "ifndef"):
            if word == "if":
                value = _condition(rest, macros, strict) if live else False
            else:
                value = (rest.strip() in macros) == (word == "ifdef")
            stack.append((live, value))
            live = live and value
        elif word in ("elif", "else"):
            if not stack:
                raise ParseError(f"#{word} without #if")
            outer, taken = stack[-1]
            value = not taken and (word == "else" or _condition(rest, macros, strict)) if outer else False
            stack[-1] = (outer, taken or value)
            live = outer and value
        elif word == "endif":
            if not stack:
                raise ParseError("#endif without #if")
            live = stack.pop()[0]
        out.append("")
    if stack:
        raise ParseError("#if without #endif")
    return "\n".join(out)


# ---- classes and their declarations ---------------------------------------------


def _match(text: str, i: int, open_: str, close: str) -> int:
    """Index just past the bracket closing the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    raise ParseError(f"unbalanced {open_}{close}")


def class_body(text: str, name: str) -> str:
    """The body (between its braces) of the class or struct ``name``'s definition."""
    pattern = re.compile(
        r"\b(?:class|struct)\s+(?:[A-Za-z_]\w*\s+)*?" + re.escape(name) + r"\b\s*(?:final\b)?\s*(:[^{;]*)?\{"
    )
    m = pattern.search(text)
    if m is None:
        raise ParseError(f"no definition of class {name}")
    start = m.end() - 1
    return text[start + 1 : _match(text, start, "{", "}") - 1]


def _split_top(text: str, sep: str) -> list[str]:
    """text split at ``sep`` outside (), <>, [] and {}."""
    parts, depth, cur = [], 0, []
    for c in text:
        if c in "(<[{":
            depth += 1
        elif c in ")>]}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return parts


def _declarator(head: str) -> tuple[str, str, str, str] | None:
    """(leading text, name, parameter text, trailing text) of a function
    declaration's head, or None when it declares no function."""
    text = re.sub(r"^\s*template\s*<", "<", head)
    if text.startswith("<"):
        text = text[_match(text, 0, "<", ">") :]
    if re.match(r"\s*(?:class|struct|union|enum|using|typedef|friend)\b", text):
        return None
    for m in re.finditer(r"(~?\s*[A-Za-z_]\w*|operator\s*(?:\(\)|[^\s(]+))\s*\(", text):
        word = m.group(1).replace(" ", "")
        if word in ("decltype", "alignas", "noexcept", "sizeof", "__attribute__") or re.fullmatch(
            r"[A-Z][A-Z0-9_]*", word
        ):
            continue
        if _depth_at(text, m.start()) != 0:
            continue
        open_ = m.end() - 1
        close = _match(text, open_, "(", ")")
        return text[: m.start()], word, text[open_ + 1 : close - 1], text[close:]
    return None


def _depth_at(text: str, pos: int) -> int:
    depth = 0
    for c in text[:pos]:
        if c in "(<[":
            depth += 1
        elif c in ")>]":
            depth -= 1
    return depth


def normalise_type(param: str) -> str:
    """A parameter's type: default value, name and namespace qualifiers dropped,
    spaces only between words."""
    p = _split_top(param, "=")[0].strip()
    if not p or p == "void":
        return ""
    tokens = re.findall(r"[A-Za-z_][\w:]*(?:<[^()]*?(?:\([^()]*\))?[^()]*?>)?|[*&]+|\S", p)
    if len(tokens) > 1 and re.fullmatch(r"[A-Za-z_]\w*", tokens[-1]) and tokens[-1] not in BUILTIN_WORDS:
        if any(t not in QUALIFIERS for t in tokens[:-1]):
            tokens = tokens[:-1]
    t = " ".join(tokens)
    t = re.sub(r"\b(?:[A-Za-z_]\w*::)+", "", t)
    t = re.sub(r"\s*([*&<>,()])\s*", r"\1", t)
    return t


def _method(head: str, class_name: str) -> Method | None:
    parts = _declarator(head)
    if parts is None:
        return None
    lead, name, params, trail = parts
    if name.lstrip("~") == class_name or name.startswith("~") or name.startswith("operator"):
        return None
    words = set(re.findall(r"[A-Za-z_]\w*", lead))
    if "static" in words:
        return None
    trail_words = re.findall(r"[A-Za-z_]\w*|=\s*0\b", trail.split("->")[0])
    declares_override = "override" in trail_words
    final = "final" in trail_words
    types = tuple(t for t in (normalise_type(x) for x in _split_top(params, ",")) if t)
    return Method(
        name=name,
        params=types,
        const="const" in trail_words,
        virtual="virtual" in words or declares_override or final,
        pure=bool(re.search(r"=\s*0\s*$", trail.strip())),
        final=final,
        declares_override=declares_override,
    )


def declarations(body: str) -> list[str]:
    """The top-level declarations of a class body, access labels dropped; a
    function defined in the class ends at its body, which is left out."""
    out: list[str] = []
    cur: list[str] = []
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c == "{":
            end = _match(body, i, "{", "}")
            head = "".join(cur)
            if _opens_function_body(head):
                out.append(head)
                cur = []
            else:
                cur.append(body[i:end])  # a nested type's body or a brace initialiser
            i = end
            continue
        if c == "(":
            end = _match(body, i, "(", ")")
            cur.append(body[i:end])
            i = end
            continue
        if c == ";":
            out.append("".join(cur))
            cur = []
        elif c == ":" and re.search(r"\b(public|private|protected)\s*$", "".join(cur)) and not body.startswith("::", i):
            cur = []
        else:
            cur.append(c)
        i += 1
    return [re.sub(r"\s+", " ", d).strip() for d in out if d.strip()]


def _opens_function_body(head: str) -> bool:
    """Whether a ``{`` after ``head`` opens a function's body (not a nested
    type's body or a brace initialiser, also one in a constructor's list)."""
    parts = _declarator(head)
    if parts is None:
        return False
    trail = parts[3].strip()
    return not trail.startswith(":") or trail.endswith(")") or trail.endswith("}")


def methods(text: str, class_name: str) -> list[Method]:
    """Every member function declared in class ``class_name`` of (preprocessed) text."""
    body = class_body(text, class_name)
    found = (_method(d, class_name) for d in declarations(body))
    return [m for m in found if m is not None]


# ---- torch's interface and memalloc's answer -------------------------------------


def torch_include() -> Path:
    import torch  # the torch in use

    return Path(torch.__file__).parent / "include"


def torch_version(include: Path) -> tuple[int, int]:
    candidates = [
        include / "torch" / "headeronly" / "version.h",
        include / "torch" / "csrc" / "api" / "include" / "torch" / "version.h",
    ]
    text = "".join(p.read_text() for p in candidates if p.is_file())
    major = re.search(r"#define\s+TORCH_VERSION_MAJOR\s+(\d+)", text)
    minor = re.search(r"#define\s+TORCH_VERSION_MINOR\s+(\d+)", text)
    if major is None or minor is None:
        raise ParseError("torch/version.h has no TORCH_VERSION_MAJOR/MINOR")
    return int(major.group(1)), int(minor.group(1))


def version_macros(version: tuple[int, int]) -> dict[str, int]:
    return {
        "TORCH_VERSION_MAJOR": version[0],
        "TORCH_VERSION_MINOR": version[1],
        "MEMALLOC_TORCH_MAJOR": version[0],
        "MEMALLOC_TORCH_MINOR": version[1],
        "MEMALLOC_WITH_TORCH_CUDA": 1,
    }


def interface(include: Path, version: tuple[int, int]) -> dict[str, tuple[str, Method]]:
    """key -> (the class of the chain that declares it last, the method) for
    every virtual method of torch's CUDAAllocator, its bases' included."""
    macros = version_macros(version)
    found: dict[str, tuple[str, Method]] = {}
    virtual_names: set[str] = set()
    for header, cls in CHAIN:
        text = preprocess((include / header).read_text(), macros)
        for m in methods(text, cls):
            if m.virtual or m.key in found:
                virtual_names.add(m.key)
                found[m.key] = (cls, m)
    return {k: v for k, v in found.items() if k in virtual_names}


def answered_by(include: Path, version: tuple[int, int], key: str, owner: str) -> str:
    """Who answers ``key`` when memalloc does not override it: the pluggable
    class when it overrides it, else the interface class that defines it."""
    text = preprocess((include / PLUGGABLE[0]).read_text(), version_macros(version))
    if any(m.key == key for m in methods(text, PLUGGABLE[1])):
        return "CUDAPluggableAllocator"
    return owner


def subclass_methods(version: tuple[int, int], source: Path = SUBCLASS_SOURCE) -> list[Method]:
    """memalloc's subclass as the compiler sees it for this torch version."""
    return methods(preprocess(source.read_text(), version_macros(version), strict=True), SUBCLASS)


def inherited_list(header: Path = SUBCLASS_HEADER) -> dict[str, str]:
    """The methods memalloc inherits on purpose: ``//   inherited NAME: reason``
    entries (continued on deeper-indented comment lines) in its header.
    NAME is a method name, or a key (``name(types)``) where overloads differ."""
    entries: dict[str, str] = {}
    current: str | None = None
    for line in header.read_text().splitlines():
        m = re.match(r"//\s{1,3}inherited (\w+(?:\([^)]*\)(?: const)?)?): (.*)", line)
        if m:
            current = m.group(1)
            entries[current] = m.group(2).strip()
            continue
        cont = re.match(r"//\s{4,}(\S.*)", line)
        if current is not None and cont:
            entries[current] += " " + cont.group(1).strip()
        else:
            current = None
    return entries


@dataclass
class Report:
    torch_version: tuple[int, int]
    overridden: list[str] = field(default_factory=list)
    inherited: dict[str, str] = field(default_factory=dict)  # key -> reason (and who answers)
    missing: dict[str, str] = field(default_factory=dict)  # key -> who answers instead, and any near miss
    stale: list[str] = field(default_factory=list)  # listed as inherited but overridden
    strays: list[str] = field(default_factory=list)  # memalloc `override`s that match nothing

    def as_json(self) -> dict[str, object]:
        return {
            "torch_version": "%d.%d" % self.torch_version,
            "overridden": self.overridden,
            "inherited": self.inherited,
            "missing": self.missing,
            "stale": self.stale,
            "strays": self.strays,
        }


def report(include: Path | None = None, source: Path = SUBCLASS_SOURCE, header: Path = SUBCLASS_HEADER) -> Report:
    """The subclass of ``source`` against the interface of the torch headers at ``include``."""
    include = include or torch_include()
    version = torch_version(include)
    wanted = interface(include, version)
    ours = subclass_methods(version, source)
    ours_keys = {m.key for m in ours}
    listed = inherited_list(header)
    r = Report(version)
    for key, (owner, method) in sorted(wanted.items()):
        reason = listed.get(key, listed.get(method.name))
        if key in ours_keys:
            r.overridden.append(key)
            if key in listed or (
                method.name in listed and all(k in ours_keys for k in _overloads(wanted, method.name))
            ):
                r.stale.append(key)
        elif reason is not None:
            r.inherited[key] = f"{reason} [answered by {answered_by(include, version, key, owner)}]"
        else:
            near = [m.key for m in ours if m.name == method.name]
            why = f"answered by {answered_by(include, version, key, owner)}"
            if near:
                why += f"; memalloc declares {', '.join(near)}, which does not override it"
            r.missing[key] = why
    r.strays = sorted(m.key for m in ours if m.declares_override and m.key not in wanted)
    return r


def _overloads(wanted: dict[str, tuple[str, Method]], name: str) -> list[str]:
    return [k for k, (_, m) in wanted.items() if m.name == name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--include", type=Path, default=None, help="torch's include folder (default: the torch in use)")
    args = parser.parse_args(argv)
    r = report(args.include)
    if args.json:
        print(json.dumps(r.as_json(), indent=2))
    else:
        print(
            f"torch {r.torch_version[0]}.{r.torch_version[1]}: {len(r.overridden)} overridden, "
            f"{len(r.inherited)} inherited on purpose, {len(r.missing)} missing"
        )
        for key, why in r.inherited.items():
            print(f"  inherited {key}: {why}")
        for key, why in r.missing.items():
            print(f"  MISSING   {key}: {why}")
    return 1 if r.missing or r.stale or r.strays else 0


if __name__ == "__main__":
    sys.exit(main())
