// ipc_wire.cpp — torch's ShareableHandle bytes (invariants: ipc_wire.h).
#include "boundary/torch/ipc_wire.h"

#include <cstring>

#include "common/errors.h"

namespace memalloc::ipc_wire {
namespace {

constexpr size_t kHeaderV2 = 24;  // pid, pad, page bytes, pages
constexpr size_t kHeaderV3 = 32;  // + handle type, pad

template <typename T>
T read_at(const std::string& s, size_t at) {
  T v{};
  std::memcpy(&v, s.data() + at, sizeof(T));  // little-endian, as torch writes it
  return v;
}

template <typename T>
void put(std::string* s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  s->append(b, sizeof(T));
}

[[noreturn]] void refuse(const std::string& what) {
  throw InvalidArgument("cannot read this CUDA IPC handle: " + what +
                        ". memalloc reads the forms torch 2.11 to 2.14 write (a bare 64-byte cudaIpcMemHandle, "
                        "[version]['c'] for a cudaMalloc segment, [2 or 3]['e'] for expandable segments); the "
                        "sending process may run a torch this memalloc does not know");
}

}  // namespace

int version_for_torch(int major, int minor) { return (major > 2 || (major == 2 && minor >= 13)) ? 3 : 2; }

Decoded decode(const std::string& h) {
  Decoded d;
  if (h.size() == kCudaIpcBytes) {  // legacy: no prefix
    d.cuda_ipc = h;
    return d;
  }
  if (h.size() < 2) refuse(std::to_string(h.size()) + " bytes are too few");
  d.version = static_cast<unsigned char>(h[0]);
  d.type = h[1];
  if (d.type == kCudaMalloc) {
    if (d.version < 1 || d.version > 3) refuse("version " + std::to_string(d.version) + " of a 'c' handle");
    if (h.size() != 2 + kCudaIpcBytes)
      refuse("a 'c' handle has " + std::to_string(2 + kCudaIpcBytes) + " bytes, this one " + std::to_string(h.size()));
    d.cuda_ipc = h.substr(2);
    return d;
  }
  if (d.type != kExpandable)
    refuse("unknown type byte " + std::to_string(static_cast<unsigned char>(d.type)) + " (version " +
           std::to_string(d.version) + ")");
  if (d.version != 2 && d.version != 3) refuse("version " + std::to_string(d.version) + " of an 'e' handle");
  const size_t header = d.version == 2 ? kHeaderV2 : kHeaderV3;
  if (h.size() < 2 + header)
    refuse("an 'e' handle of version " + std::to_string(d.version) + " has a " + std::to_string(header) +
           "-byte header, this one only " + std::to_string(h.size()) + " bytes in all");
  d.pid = read_at<int32_t>(h, 2);
  d.page_bytes = read_at<uint64_t>(h, 2 + 8);
  const uint64_t pages = read_at<uint64_t>(h, 2 + 16);
  const size_t payload = h.size() - 2 - header;
  if (d.page_bytes == 0 || pages == 0) refuse("an 'e' handle of no pages");
  if (d.version == 3) {
    const int type = read_at<int32_t>(h, 2 + 24);
    if (type != static_cast<int>(PageHandle::kPosixFd) && type != static_cast<int>(PageHandle::kFabric))
      refuse("page handle type " + std::to_string(type) + " (1 is a POSIX fd, 2 a fabric handle)");
    d.handle = static_cast<PageHandle>(type);
  } else {  // 2.11 does not say: the payload's length does
    if (payload == pages * sizeof(int32_t))
      d.handle = PageHandle::kPosixFd;
    else if (payload == pages * kFabricBytes)
      d.handle = PageHandle::kFabric;
    else
      refuse(std::to_string(pages) + " pages in " + std::to_string(payload) + " bytes of payload");
  }
  const size_t each = d.handle == PageHandle::kPosixFd ? sizeof(int32_t) : kFabricBytes;
  if (payload != pages * each)
    refuse(std::to_string(pages) + " pages need " + std::to_string(pages * each) + " bytes of payload, not " +
           std::to_string(payload));
  const size_t at = 2 + header;
  for (uint64_t i = 0; i < pages; ++i) {
    if (d.handle == PageHandle::kPosixFd)
      d.fds.push_back(read_at<int32_t>(h, at + i * each));
    else
      d.fabric.push_back(h.substr(at + i * each, each));
  }
  return d;
}

std::string encode_cuda_malloc(int version, const std::string& cuda_ipc) {
  MEMALLOC_EXPECTS(cuda_ipc.size() == kCudaIpcBytes, "encode_cuda_malloc: a cudaIpcMemHandle has 64 bytes");
  if (version == 0) return cuda_ipc;
  std::string s;
  s.push_back(static_cast<char>(version));
  s.push_back(kCudaMalloc);
  return s + cuda_ipc;
}

std::string encode_expandable(int version, int pid, size_t page_bytes, const std::vector<int>& fds) {
  MEMALLOC_EXPECTS(version == 2 || version == 3, "encode_expandable: version 2 or 3");
  MEMALLOC_EXPECTS(page_bytes > 0 && !fds.empty(), "encode_expandable: at least one page of positive size");
  std::string s;
  s.push_back(static_cast<char>(version));
  s.push_back(kExpandable);
  put<int32_t>(&s, pid);
  put<int32_t>(&s, 0);  // padding, zeroed (torch 2.13 leaves it unset: #198305)
  put<uint64_t>(&s, page_bytes);
  put<uint64_t>(&s, fds.size());
  if (version == 3) {
    put<int32_t>(&s, static_cast<int32_t>(PageHandle::kPosixFd));
    put<int32_t>(&s, 0);
  }
  for (int fd : fds) put<int32_t>(&s, fd);
  return s;
}

}  // namespace memalloc::ipc_wire
