// pyframes_probe.cpp — a minimal CPython extension (C API only, no torch,
// no pybind11) around csrc/boundary/callers/pyframes.cpp, built by
// tests/unit/test_pyframes.py against every local CPython so that the GIL-free
// frame walk is checked on each interpreter version it supports.
//
//   walk()      -> [(filename, line, qualname)], innermost first, read with
//                  the GIL released (as an allocation arrives from torch)
//   supported() -> bool, fast_frames_supported()
#include <Python.h>

#include "boundary/callers/pyframes.h"

namespace {
PyObject* walk(PyObject*, PyObject*) {
  memalloc::RawFrame frames[memalloc::StackTable::kMaxDepth];
  size_t n = 0;
  Py_BEGIN_ALLOW_THREADS n = memalloc::own_frames(frames, memalloc::StackTable::kMaxDepth);
  Py_END_ALLOW_THREADS PyObject* out = PyList_New(0);
  for (size_t i = 0; i < n && out != nullptr; ++i) {
    auto* code = reinterpret_cast<PyCodeObject*>(const_cast<void*>(frames[i].code));
    PyObject* obj = reinterpret_cast<PyObject*>(code);
    PyObject* file = PyObject_GetAttrString(obj, "co_filename");
    PyObject* name = PyObject_GetAttrString(obj, "co_qualname");
    PyObject* item = Py_BuildValue("(NiN)", file, PyCode_Addr2Line(code, frames[i].lasti), name);
    if (item == nullptr || PyList_Append(out, item) != 0) Py_CLEAR(out);
    Py_XDECREF(item);
  }
  return out;
}

PyObject* supported(PyObject*, PyObject*) { return PyBool_FromLong(memalloc::fast_frames_supported()); }

PyMethodDef methods[] = {
    {"walk", walk, METH_NOARGS, "The calling thread's frames, read without the GIL."},
    {"supported", supported, METH_NOARGS, "Whether this CPython has the GIL-free walk."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pyframes_probe", nullptr, -1, methods, nullptr, nullptr, nullptr, nullptr};
}  // namespace

PyMODINIT_FUNC PyInit_pyframes_probe() { return PyModule_Create(&module); }
