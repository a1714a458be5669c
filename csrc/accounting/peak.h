// peak.h — the one window mechanism behind every peak the allocator keeps:
//   Stat::peak            (accounting.h) restarted by reset_peak()
//                         (torch.cuda.reset_peak_memory_stats)
//   the step window       (accounting.h) restarted by take_window()
//                         (the step tracker)
//   the breakdown's peak  (breakdown.h) restarted by end_window()
//                         (memalloc.step(): the end of a training step)
// Each owner holds its own Peak objects and restarts only them, so the three
// windows never disturb each other.
//
// The rule, written once here (Level(v) is how high a value v is):
//   while a window runs, raise(current) is called wherever the value may
//   have risen; after it Level(value()) == max(Level of every value raised
//   since the window began, Level of the value it began at)
//   restart(current) ends the window: it returns the window's peak and the
//   next window begins at `current`
//   relabel(f) may change how the peak is described (the breakdown moves
//   bytes between categories) but never its level
// Header-only; raise() is one compare (and a copy when higher): no
// allocation, no lock, the hot path's cost of a peak.
#pragma once

#include <cassert>
#include <utility>

namespace memalloc {

// The level of a value that is its own level (a byte count).
struct SelfLevel {
  template <typename T>
  const T& operator()(const T& v) const {
    return v;
  }
};

template <typename T, typename Level = SelfLevel>
class Peak {
 public:
  Peak() = default;
  explicit Peak(const T& start) : value_(start) {}

  // `current` becomes the peak when it is higher; true when it did.
  bool raise(const T& current) {
    if (!(Level{}(value_) < Level{}(current))) return false;
    value_ = current;
    return true;
  }
  // Ends the window: returns its peak; the next window begins at `current`.
  T restart(const T& current) {
    T ended = std::move(value_);
    value_ = current;
    return ended;
  }
  const T& value() const { return value_; }
  // f(T&) rewrites how the peak is described; its level stays as it was.
  template <typename F>
  void relabel(F&& f) {
    [[maybe_unused]] const auto level = Level{}(value_);
    f(value_);
    assert(!(Level{}(value_) < level) && !(level < Level{}(value_)));
  }

 private:
  T value_{};
};

}  // namespace memalloc
