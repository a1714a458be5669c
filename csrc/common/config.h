// config.h — the allocator's configuration, parsed once, immutable after.
//
// Invariants:
//   * A Config is built only by parse_config() (or default-constructed) and
//     is handed by value to constructors; policy code never reads the
//     environment or a global.
//   * Every field below has exactly one key in kConfigKeys; parse_config()
//     rejects any other key with the list of valid ones.
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
// device; record_history above it is refused here.
constexpr size_t kMaxTraceRecords = size_t{1} << 28;

struct Config {
  // "auto" | "cuda" | "host". Read by the Python layer (enable()); the core
  // is told which backend to build explicitly.
  std::string backend = "auto";
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
  // Python layer, host backend: answer torch.cuda.memory_allocated & co.
  // from the simulated device (on CUDA torch's own functions answer).
  bool patch_torch = true;
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
  // Python layer: memalloc.step() empties the cache every N steps; 0 = off.
  size_t empty_cache_every_n_steps = 0;
  // Python layer: record events from enable() on, in a ring of this many
  // records per device (0 = off), with this stack mode.
  size_t record_history = 0;
  std::string record_stacks = "python";
  // Python layer: from enable() on, every allocation keeps its Python call
  // stack (the stack mode "python"), so OOM messages, top_holders and leak
  // reports name lines with no setup; False = no stacks unless recording or
  // a leak check asks for them.
  bool call_sites = true;
  // The flight recorder (memalloc/features/flight.py): the directory of the
  // per-process files ("" = off), and whether a clean exit keeps the file.
  std::string flight_recorder;
  bool flight_recorder_keep = false;
  // Host backend only: simulated capacity of each device, in bytes.
  size_t host_capacity = size_t{1} << 30;
  // Host backend only: number of simulated devices.
  int host_devices = 1;

  // The canonical "key:value,..." text of this config (round-trips through
  // parse_config).
  std::string to_string() const;
};

// Valid keys, in documentation order.
const std::vector<std::string>& config_keys();

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
