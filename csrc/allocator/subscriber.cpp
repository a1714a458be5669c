// subscriber.cpp — DeviceAllocator::set_subscriber: the one way the layer
// above (subscriber.h) attaches to a device. Invariants: subscriber.h.
#include "allocator/device_allocator.h"
#include "common/errors.h"

namespace memalloc {

void DeviceAllocator::set_subscriber(Subscriber* s) {
  std::lock_guard<std::mutex> lock(mu_);
  MEMALLOC_EXPECTS(live_.empty() && events_.idle() && !events_.has_deferred(),
                   "set_subscriber: device " + std::to_string(device_) +
                       " has live or pending blocks; a subscriber is set before the first allocation, "
                       "so that it knows of every block its Events name");
  sink_.set_subscriber(s);
}

}  // namespace memalloc
