// config.h — the allocator's configuration, parsed once, immutable after.
//
// Invariants:
//   * A Config is built only by parse_config() (or default-constructed) and
//     is handed by value to constructors; policy code never reads the
//     environment or a global.
//   * Every field below has exactly one key in config_keys(); parse_config()
//     rejects any other key with the list of valid ones. The keys only the
//     Python layer reads (backend, patch_torch, record_history, ...) are
//     not here: boundary/python/settings.h owns them.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace memalloc {

// Size intervals of roundup_power2_divisions (native's): [i] holds requests
// of [2^i, 2^(i+1)) MiB, [0] also everything below 1 MiB, the last also
// everything above.
constexpr size_t kRoundupIntervals = 16;

// The largest trace ring (profiler/recorder.h): 2^28 records, 16 GiB per
// device; record_history above it is refused (boundary/python/settings.cpp).
constexpr size_t kMaxTraceRecords = size_t{1} << 28;

struct Config {
  // Blocks of at least this many bytes are never split (native:
  // max_split_size_mb). SIZE_MAX = unlimited.
  size_t max_split_size = static_cast<size_t>(-1);
  // Round requests up to one of N divisions of the enclosing power of two
  // (native: roundup_power2_divisions), N per size interval (one value, or
  // torch's list "[64:8,128:2,>:1]": interval bounds in MiB). 0 = off
  // (plain 512 B rounding).
  std::array<size_t, kRoundupIntervals> roundup_power2_divisions{};
  // The divisions for a request of `bytes` (inline: on the fast path).
  size_t divisions_for(size_t bytes) const {
    const size_t mib = bytes >> 20;
    const size_t index = mib == 0 ? 0 : 63 - static_cast<size_t>(__builtin_clzll(mib));
    return roundup_power2_divisions[index < kRoundupIntervals ? index : kRoundupIntervals - 1];
  }
  // Empty-cache policy "threshold": 0 < t < 1 releases unused cached
  // segments before reserved memory would exceed t * limit; 0 = off.
  double garbage_collection_threshold = 0.0;
  // Expandable segments (vm_arena.h; torch's key): the default pool's
  // segments are address ranges backed page by page, reserved = mapped bytes.
  bool expandable_segments = false;
  // With expandable_segments: before mapping pages that would take reserved
  // bytes above 1.05 x the most bytes ever allocated, unmap free whole pages
  // of the same stream's segments (one stream synchronisation), so reserved
  // stays near allocated while a steady loop (below the ceiling) never
  // synchronises; False: free pages are unmapped only by empty_cache and
  // before an OOM (native's expandable segments).
  bool reuse_free_pages = true;
  // torch's key: a block freed during a CUDA graph capture after
  // record_stream() is reused within the same capture once the capture's
  // graph orders all its uses before the allocating stream's next work
  // (capture_reuse.h); False: it waits for the capture's end (native's
  // default).
  bool graph_capture_record_stream_reuse = false;
  // Host backend only: simulated capacity of each device, in bytes.
  size_t host_capacity = size_t{1} << 30;
  // Host backend only: number of simulated devices.
  int host_devices = 1;

  // The canonical "key:value,..." text of this config (round-trips through
  // parse_config).
  std::string to_string() const;
};

// The core's keys, in documentation order (memalloc.config_keys() adds the
// Python layer's: boundary/python/settings.h).
const std::vector<std::string>& config_keys();

// Sets `key` of `c` from `value` when it is one of config_keys() (throws
// InvalidArgument naming a bad value and the valid ones); false, changing
// nothing, for any other key.
bool apply_config_key(Config& c, const std::string& key, const std::string& value);
// Throws InvalidArgument for an entry of `text` without ':'.
void check_config_entries(const std::string& text);
// The message for an unknown key, listing `valid`.
std::string unknown_config_key(const std::string& key, const std::vector<std::string>& valid);
// The value parsers every layer's keys share (their messages name the key).
size_t parse_config_uint(const std::string& key, const std::string& value);
bool parse_config_bool(const std::string& key, const std::string& value);

// The "key:value" entries of settings text, in order (the one splitter of
// that text: parse_config and memalloc/core/_settings.py use it): commas
// inside brackets stay in their value, whitespace around keys and values is
// dropped, empty entries are skipped, an entry without ':' has value "".
std::vector<std::pair<std::string, std::string>> config_entries(const std::string& text);

// Parses "key:value,key:value" (PYTORCH_CUDA_ALLOC_CONF style; a value may be
// a bracketed list with its own commas). Whitespace around keys and values is
// ignored; an empty string gives the defaults.
// Throws InvalidArgument naming the bad key or value and the valid choices.
Config parse_config(const std::string& text);

}  // namespace memalloc
