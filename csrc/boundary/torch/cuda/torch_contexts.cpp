// torch_contexts.cpp — see torch_contexts.h.
#include <Python.h>

#include <torch/csrc/profiler/combined_traceback.h>

#include <mutex>
#include <vector>

#include "process/registry.h"
#include "boundary/torch/cuda/torch_contexts.h"

namespace memalloc {
namespace {

using Traceback = torch::CapturedTraceback;

// The frames being turned into a context on this thread (nullptr: none, and
// the unwinder lets torch's own answer).
thread_local const std::vector<RawFrame>* t_frames = nullptr;

class StackUnwinder final : public Traceback::Python {
 public:
  bool canGather() override { return t_frames != nullptr; }
  std::vector<Traceback::PyFrame> gather() override {
    std::vector<Traceback::PyFrame> out;
    out.reserve(t_frames->size());
    for (const RawFrame& f : *t_frames) out.push_back(Traceback::PyFrame{const_cast<void*>(f.code), f.lasti});
    return out;
  }
  void release(std::vector<Traceback::PyFrame>&) override {}  // kept alive by the stack table
  void appendSymbolized(const std::vector<Traceback::PyFrame>& frames, torch::SymbolizedTracebacks& out) override {
    PyGILState_STATE gil = PyGILState_Ensure();
    for (const Traceback::PyFrame& f : frames) {
      auto* code = static_cast<PyCodeObject*>(f.code);
      PyObject* obj = reinterpret_cast<PyObject*>(code);
      out.tracebacks.emplace_back();  // one fragment per frame (torch's symbolize() contract)
      out.tracebacks.back().push_back(out.all_frames.size());
      out.all_frames.push_back(torch::unwind::Frame{text_attr(obj, "co_filename"), name_of(obj),
                                                    static_cast<uint64_t>(PyCode_Addr2Line(code, f.lasti))});
    }
    PyGILState_Release(gil);
  }
  int traverse(std::vector<Traceback::PyFrame>&, Traceback::visitproc, void*) override { return 0; }
  int clear(std::vector<Traceback::PyFrame>&) override { return 0; }

 private:
  // str attribute `name` of `obj`, "" when missing (GIL held).
  static std::string text_attr(PyObject* obj, const char* name) {
    std::string out;
    PyObject* v = PyObject_GetAttrString(obj, name);
    if (v != nullptr && PyUnicode_Check(v)) {
      const char* s = PyUnicode_AsUTF8(v);
      if (s != nullptr) out = s;
    }
    Py_XDECREF(v);
    if (PyErr_Occurred()) PyErr_Clear();
    return out;
  }
  static std::string name_of(PyObject* code) {
    std::string q = text_attr(code, "co_qualname");
    return q.empty() ? text_attr(code, "co_name") : q;
  }
};

StackUnwinder* unwinder() {
  static StackUnwinder* u = [] {
    auto* p = new StackUnwinder();  // torch keeps registered unwinders forever
    Traceback::addPythonUnwinder(p);
    return p;
  }();
  return u;
}

}  // namespace

std::shared_ptr<c10::GatheredContext> StackContexts::of(uint32_t stack_id) {
  if (stack_id == 0) return nullptr;
  auto it = cache_.find(stack_id);
  if (it != cache_.end()) return it->second;
  unwinder();
  const std::vector<RawFrame> frames = AllocatorRegistry::instance().stacks().frames(stack_id);
  std::shared_ptr<c10::GatheredContext> ctx;
  if (!frames.empty()) {
    struct Pending {  // t_frames is set exactly while gather() runs
      explicit Pending(const std::vector<RawFrame>* f) { t_frames = f; }
      ~Pending() { t_frames = nullptr; }
    } pending(&frames);
    ctx = Traceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false);
  }
  cache_.emplace(stack_id, ctx);
  return ctx;
}

}  // namespace memalloc
