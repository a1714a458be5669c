"""DeviceAllocator is a facade (issue 39): it takes the lock and dispatches to
parts that own their state. Its size is read from the header (no build):
member functions (constructors and the deleted copy included, every
declaration in the class body) and data members. The counts may only go
down: each bound is the count when it was last lowered; the issue's target
is about 35 member functions."""

from __future__ import annotations

import re
from pathlib import Path

HEADER = Path(__file__).resolve().parents[2] / "csrc" / "allocator" / "device_allocator.h"

MAX_FUNCTIONS = 35  # 88 before issue 39's first steps (2026-12-05), 46 at session 23's start, 37 at 25's, 36 at 26's
MAX_FIELDS = 13  # 24 then


def class_body(text: str, name: str) -> str:
    start = text.index("{", text.index(f"class {name} {{"))
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i]
    raise AssertionError(f"class {name} has no closing brace")


def declarations(body: str) -> list[str]:
    """The class's top-level declarations: nested bodies (inline functions,
    nested types) and comments removed, split at ';'."""
    flat, depth = [], 0
    for ch in body:
        if ch == "{":
            depth += 1
            if depth == 1:
                flat.append(";")  # an inline body ends its declaration
            continue
        if ch == "}":
            depth -= 1
            continue
        if depth == 0:
            flat.append(ch)
    text = re.sub(r"//[^\n]*", "", "".join(flat))
    text = re.sub(r"\b(public|private|protected):", "", text)
    return [" ".join(d.split()) for d in text.split(";") if d.strip()]


def members(text: str, name: str = "DeviceAllocator") -> tuple[list[str], list[str]]:
    functions, fields = [], []
    for d in declarations(class_body(text, name)):
        if d.startswith(("using ", "struct ", "class ", "friend ")):
            continue
        head = d.split("=")[0]
        if "(" in head and not re.search(r"\w+_\s*$", head.split("(")[0]):
            functions.append(d)
        elif re.search(r"\w+_\s*(\{|$)", head.strip()) or re.search(r"\w+_$", head.strip()):
            fields.append(d)
    return functions, fields


def test_the_counter_reads_a_known_class():
    text = """
    class DeviceAllocator {
     public:
      DeviceAllocator(int d);
      void* malloc(size_t size, Stream s = 0);
      template <class F>
      decltype(auto) with_pools(F&& f) {
        return f(pools_);
      }
      int device() const { return device_; }
     private:
      struct Inner { int x; };
      using Table = std::map<int, int>;
      void helper_locked();
      const int device_;
      std::mutex mu_;
      double fraction_ = -1.0;  // a comment (with parentheses)
      Limits limits_{0.5};
    };
    """
    functions, fields = members(text)
    names = [next(n for n in re.findall(r"(~?\w+)\s*\(", f) if n != "decltype") for f in functions]
    assert names == ["DeviceAllocator", "malloc", "with_pools", "device", "helper_locked"]
    assert [re.search(r"(\w+_)", f).group(1) for f in fields] == ["device_", "mu_", "fraction_", "limits_"]


def test_device_allocator_only_shrinks():
    functions, fields = members(HEADER.read_text())
    assert len(functions) <= MAX_FUNCTIONS, (
        f"DeviceAllocator has {len(functions)} member functions (at most {MAX_FUNCTIONS}): give the new work to a "
        "part that owns its state (docs/architecture.md) instead of the facade"
    )
    assert len(fields) <= MAX_FIELDS, f"DeviceAllocator has {len(fields)} fields (at most {MAX_FIELDS})"
