// cpu_allocator.h — memalloc's host backend as torch's CPU allocator (see
// cpu_allocator.cpp).
#pragma once

namespace memalloc {
// Makes torch's CPU tensors come from device 0 of the installed host-backend
// allocator. Throws InvalidArgument when none is installed. Irreversible.
void use_for_torch_cpu();
// Whether use_for_torch_cpu() has run in this process.
bool used_for_torch_cpu();
}  // namespace memalloc
