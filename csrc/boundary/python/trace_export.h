// trace_export.h — recorded events to torch's snapshot trace entries, in C++
// (see trace_export.cpp).
#pragma once

#include <pybind11/pybind11.h>

namespace memalloc {
// The entries of torch's "device_traces" for the records in `raw` (bytes,
// 64 per record, oldest first), keeping those whose action index is set in
// `keep` (a sequence of bool per action). `tags` names tag ids; `frames_of`
// (stack_id -> list of {"filename", "line", "name"}) is called once per
// distinct stack id and its result is shared by every entry with that stack.
// GIL held.
pybind11::list trace_entries(const pybind11::bytes& raw, const pybind11::sequence& keep, const pybind11::sequence& tags,
                             const pybind11::function& frames_of);
}  // namespace memalloc
