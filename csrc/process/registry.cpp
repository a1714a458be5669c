// registry.cpp — CachingAllocator (devices of one backend) and the
// AllocatorRegistry (see registry.h for invariants).
#include "process/registry.h"

#include "common/clock.h"
#include "common/errors.h"

namespace memalloc {

CachingAllocator::CachingAllocator(std::unique_ptr<Backend> backend, const Config& config, std::string settings_text)
    : backend_(std::move(backend)), config_(config), settings_text_(std::move(settings_text)) {
  for (int d = 0; d < backend_->device_count(); ++d) {
    profilers_.emplace_back(new Profiler(d));
    devices_.emplace_back(new DeviceAllocator(d, *backend_, config_));
    devices_.back()->set_subscriber(profilers_.back().get());
  }
}

void CachingAllocator::set_recording(int index, size_t capacity) {
  if (capacity > 0) clock::calibrate();  // its first call measures: not under the lock
  with_profiler(index, [&](Profiler& p) { p.reset_trace(capacity); });
}

void CachingAllocator::set_recording_file(int index, TraceRecord* slots, uint64_t* seqs, size_t capacity,
                                          std::shared_ptr<void> keep) {
  clock::calibrate();  // its first call measures: not under the lock
  with_profiler(index, [&](Profiler& p) { p.attach_trace(slots, seqs, capacity, std::move(keep)); });
}

DeviceAllocator& CachingAllocator::device(int index) {
  MEMALLOC_EXPECTS(index >= 0 && index < device_count(),
                   "device " + std::to_string(index) + " does not exist: the " + backend_->name() + " backend has " +
                       std::to_string(device_count()) + " device(s), indices 0.." + std::to_string(device_count() - 1));
  return *devices_[index];
}

DeviceAllocator* CachingAllocator::find_owner(void* ptr) {
  for (auto& d : devices_)
    if (d->segment_of(ptr)) return d.get();
  return nullptr;
}

bool CachingAllocator::free_owned(void* ptr, Caller caller) {
  for (auto& d : devices_)
    if (d->free_if_owned(ptr, caller)) return true;
  return false;
}

std::shared_ptr<CachingAllocator> make_allocator(const std::string& backend, const Config& config,
                                                 const std::string& settings_text) {
  if (backend == "cuda") return std::make_shared<CachingAllocator>(make_cuda_backend(), config, settings_text);
  MEMALLOC_EXPECTS(backend == "host", "unknown backend '" + backend + "': use 'cuda' or 'host'");
  return std::make_shared<CachingAllocator>(std::unique_ptr<Backend>(new HostBackend(config)), config, settings_text);
}

AllocatorRegistry& AllocatorRegistry::instance() {
  static AllocatorRegistry* registry = new AllocatorRegistry();  // leaked on purpose
  return *registry;
}

void AllocatorRegistry::install(std::shared_ptr<CachingAllocator> a) {
  MEMALLOC_EXPECTS(a != nullptr, "install: no allocator given");
  std::lock_guard<std::mutex> g(mu_);
  MEMALLOC_EXPECTS(owner_ == nullptr, "an allocator is already installed in this process (" +
                                          std::string(owner_ ? owner_->backend().name() : "") +
                                          " backend); it cannot be replaced");
  owner_ = std::move(a);
  installed_.store(owner_.get(), std::memory_order_release);
}

namespace {
thread_local uint32_t t_tag = 0;
thread_local uint32_t t_index = 0;
std::atomic<uint32_t> g_next_thread_index{0};
}  // namespace

uint32_t AllocatorRegistry::thread_tag() { return t_tag; }
void AllocatorRegistry::set_thread_tag(uint32_t tag) { t_tag = tag; }
uint32_t AllocatorRegistry::thread_index() {
  if (t_index == 0) t_index = g_next_thread_index.fetch_add(1, std::memory_order_relaxed) + 1;
  return t_index;
}

std::shared_ptr<CachingAllocator> AllocatorRegistry::installed_shared() {
  std::lock_guard<std::mutex> g(mu_);
  return owner_;
}

}  // namespace memalloc
