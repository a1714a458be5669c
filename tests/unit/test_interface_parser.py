"""The C++ declaration reader of benchmarks/compat/interface.py on planted
snippets: comments, string literals, multi-line declarations, ``= 0``, default
arguments, templates, nested types, constructors, ``#if`` version guards; and
the report failing when the planted subclass misses a method."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.compat import interface as itf

BASE = r"""
#pragma once
// virtual void commentedOut(int) = 0;   (a comment, not a method)
/* virtual void blockComment(
      int) = 0; */
namespace c10 {
struct Allocator;  // a forward declaration, not the definition
class C10_API Iface : public Base {
 public:
  virtual ~Iface() = default;
  Iface() : a_{1}, b_(2) {}
  virtual void* raw_alloc(size_t nbytes) = 0;
  virtual void recordStream(
      const DataPtr& ptr,
      CUDAStream stream) = 0;
  void recordStream(const DataPtr& ptr, c10::Stream stream) override {
    const char* s = "} { // not a comment";
    recordStream(ptr, CUDAStream(stream));
  }
  virtual SnapshotInfo snapshot(
      MempoolId_t mempool_id = {0, 0},
      bool include_traces = true) = 0;
  virtual void beginAllocateToPool(
      c10::DeviceIndex device,
      std::function<bool(cudaStream_t)> filter) = 0;
  virtual void recordAnnotation(
      const std::vector<std::pair<std::string, std::string>>& /*md*/) {}
  virtual bool isEnabled() const = 0;
  C10_DEPRECATED_MESSAGE("use other") virtual int legacy(int /*x*/) { return 0; }
  static Iface* get();
  void notVirtual(int x);
  struct Nested {
    virtual void insideNested() = 0;
  };
  std::atomic<bool> flag_{false};
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
  virtual void newIn214(const void* /*ptr*/, const std::string& md) {}
#else
  virtual void goneIn214() {}
#endif
#ifdef USE_ROCM
  virtual void rocmOnly() = 0;
#endif

 private:
  int a_, b_;
};
}  // namespace c10
"""

SUB = r"""
class Impl final : public Iface {
 public:
  explicit Impl(int x) : Iface(), x_(x) {}
  void* raw_alloc(size_t n) override { return nullptr; }
  void recordStream(const c10::DataPtr& p, c10::cuda::CUDAStream s) override {}
  cca::SnapshotInfo snapshot(c10::MempoolId_t pool, bool traces) override { return {}; }
  void beginAllocateToPool(c10::DeviceIndex d, std::function<bool(cudaStream_t)> f) override {}
  bool isEnabled() const override { return true; }
  int legacy(int) override { return 1; }
#if MEMALLOC_TORCH_AT_LEAST(2, 14)
  void newIn214(const void* ptr, const std::string& md) override {}
#endif
 private:
  template <typename F>
  static void guard(F&& f) {}
  decltype(auto) locked(int f) { return f; }
  class Source final : public SegmentSource {
    void* allocate(size_t) override { return nullptr; }
  };
  int x_{0};
};
"""


def keys(methods: list[itf.Method]) -> dict[str, itf.Method]:
    return {m.key: m for m in methods}


@pytest.mark.parametrize("minor", [13, 14])
def test_reads_every_virtual_of_a_planted_interface(minor):
    text = itf.preprocess(BASE, itf.version_macros((2, minor)))
    found = keys(itf.methods(text, "Iface"))
    virtual = {k for k, m in found.items() if m.virtual}
    expected = {
        "raw_alloc(size_t)",
        "recordStream(const DataPtr&,CUDAStream)",
        "recordStream(const DataPtr&,Stream)",
        "snapshot(MempoolId_t,bool)",
        "beginAllocateToPool(DeviceIndex,function<bool(cudaStream_t)>)",
        "recordAnnotation(const vector<pair<string,string>>&)",
        "isEnabled() const",
        "legacy(int)",
        "newIn214(const void*,const string&)" if minor >= 14 else "goneIn214()",
    }
    assert virtual == expected
    assert found["raw_alloc(size_t)"].pure and not found["recordAnnotation(const vector<pair<string,string>>&)"].pure
    assert "notVirtual(int)" in found and not found["notVirtual(int)"].virtual
    assert not any(k.startswith(("commentedOut", "blockComment", "insideNested", "rocmOnly", "get(")) for k in found)


def test_subclass_reading_applies_memalloc_version_guards():
    for minor, has in ((13, False), (14, True), (15, True)):
        text = itf.preprocess(SUB, itf.version_macros((2, minor)), strict=True)
        found = keys(itf.methods(text, "Impl"))
        assert ("newIn214(const void*,const string&)" in found) is has, minor
        assert "allocate(size_t)" not in found  # the nested class's method
        assert "locked(int)" in found and "guard(F&&)" not in found  # static members are no overrides
        assert "recordStream(const DataPtr&,CUDAStream)" in found


def test_unknown_macro_in_memalloc_source_is_an_error_and_in_torch_headers_is_zero():
    text = "#if SOME_FLAG\nint a();\n#endif\n"
    with pytest.raises(itf.ParseError, match="SOME_FLAG"):
        itf.preprocess(text, {}, strict=True)
    assert "int a" not in itf.preprocess(text, {})
    with pytest.raises(itf.ParseError, match="without #endif"):
        itf.preprocess("#if 1\n", {})


def test_parameter_types_drop_names_defaults_and_namespaces():
    n = itf.normalise_type
    assert n(itf.strip_comments("c10::DeviceIndex /*device*/")) == n("c10::DeviceIndex ") == "DeviceIndex"
    assert n("unsigned long") == "unsigned long"
    assert n("size_t") == "size_t"
    assert n("const std::string& metadata") == "const string&"
    assert n("std::shared_ptr<cca::CUDAAllocator> allocator = nullptr") == "shared_ptr<CUDAAllocator>"
    assert n("MempoolId_t mempool_id = {0, 0}") == "MempoolId_t"
    assert n("std::function<void(int64_t, size_t)> observer") == "function<void(int64_t,size_t)>"


def plant(tmp_path: Path, sub: str, inherited: str) -> tuple[Path, Path, Path]:
    """A fake torch include folder holding BASE as the whole chain, and a
    subclass source and header."""
    include = tmp_path / "include"
    (include / "torch" / "headeronly").mkdir(parents=True)
    (include / "torch" / "headeronly" / "version.h").write_text(
        "#define TORCH_VERSION_MAJOR 2\n#define TORCH_VERSION_MINOR 14\n"
    )
    empty = "struct C10_API %s {\n  virtual ~%s() = default;\n};\n"
    for header, cls in itf.CHAIN[:-1]:
        (include / header).parent.mkdir(parents=True, exist_ok=True)
        (include / header).write_text(empty % (cls, cls))
    iface = itf.CHAIN[-1]
    (include / iface[0]).parent.mkdir(parents=True, exist_ok=True)
    (include / iface[0]).write_text(BASE.replace("Iface", iface[1]))
    (include / itf.PLUGGABLE[0]).parent.mkdir(parents=True, exist_ok=True)
    (include / itf.PLUGGABLE[0]).write_text(
        "class CUDAPluggableAllocator : public CUDAAllocator {\n void* raw_alloc(size_t nbytes) override;\n};\n"
    )
    source, header = tmp_path / "sub.cpp", tmp_path / "sub.h"
    source.write_text(sub.replace("Impl", itf.SUBCLASS))
    header.write_text(inherited)
    return include, source, header


LISTED = """// Invariants: ...
//   inherited recordAnnotation: planted reason,
//       continued on the next line
//   inherited recordStream(const DataPtr&,Stream): forwards to the CUDAStream overload
"""


def test_report_passes_when_each_virtual_is_overridden_or_listed(tmp_path):
    include, source, header = plant(tmp_path, SUB, LISTED)
    r = itf.report(include, source, header)
    assert r.torch_version == (2, 14)
    assert not r.missing and not r.stale and not r.strays, r
    assert r.inherited["recordAnnotation(const vector<pair<string,string>>&)"].startswith(
        "planted reason, continued on the next line [answered by CUDAAllocator]"
    )
    assert "raw_alloc(size_t)" in r.overridden


def test_report_fails_on_a_missing_method_a_signature_drift_a_stale_entry_and_a_stray(tmp_path):
    sub = SUB.replace("  bool isEnabled() const override { return true; }\n", "")  # missing
    sub = sub.replace("int legacy(int) override", "int legacy(long) override")  # drift: overrides nothing
    listed = LISTED + "//   inherited raw_alloc: but it is overridden\n"  # stale
    include, source, header = plant(tmp_path, sub, listed)
    r = itf.report(include, source, header)
    assert set(r.missing) == {"isEnabled() const", "legacy(int)"}
    assert "memalloc declares legacy(long)" in r.missing["legacy(int)"]
    assert r.stale == ["raw_alloc(size_t)"]
    assert r.strays == ["legacy(long)"]


def test_report_names_the_pluggable_class_where_it_answers(tmp_path):
    sub = SUB.replace("  void* raw_alloc(size_t n) override { return nullptr; }\n", "")
    include, source, header = plant(tmp_path, sub, LISTED)
    assert itf.report(include, source, header).missing == {"raw_alloc(size_t)": "answered by CUDAPluggableAllocator"}
