// settings.h — the whole settings text memalloc reads (MEMALLOC_CONF, the
// config argument of enable(), Allocator(backend, config)): the core's keys
// (common/config.h: the allocator's and the host backend's) and the keys
// only the Python layer reads (Options below: which backend enable()
// picks, the torch patch, the step policy, recording, call sites, the
// flight recorder). One splitter, one set of value parsers and one message
// for an unknown key serve both; the canonical text lists every key in
// settings_keys() order.
//
// Invariants:
//   * settings_keys() is config_keys() with the Options' keys placed in
//     documentation order; every key belongs to exactly one of them.
//   * parse_settings(settings_text(s)) == s for every valid s; a rejected
//     text changes nothing.
//   * The canonical text always names backend, host_capacity_mb and
//     host_devices, and every other key only when it differs from its
//     default.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/config.h"

namespace memalloc {

// The keys only the Python layer reads (memalloc/core/_config.py and its
// callers); the core never sees them.
struct Options {
  // "auto" | "cuda" | "host": the backend enable() installs.
  std::string backend = "auto";
  // Host backend: torch.cuda.memory_allocated & co. answer from the
  // simulated device (on CUDA torch's own functions answer).
  bool patch_torch = true;
  // memalloc.step() empties the cache every N steps; 0 = off.
  size_t empty_cache_every_n_steps = 0;
  // Record events from enable() on, in a ring of this many records per
  // device (0 = off), with this stack mode.
  size_t record_history = 0;
  std::string record_stacks = "python";
  // From enable() on, every allocation keeps its Python call stack, so OOM
  // messages, top_holders and leak reports name lines with no setup; False
  // = no stacks unless recording or a leak check asks for them.
  bool call_sites = true;
  // The flight recorder (memalloc/features/flight.py): the directory of the
  // per-process files ("" = off), and whether a clean exit keeps the file.
  std::string flight_recorder;
  bool flight_recorder_keep = false;
};

struct Settings {
  Config config;    // the core's
  Options options;  // the Python layer's
};

// Every key, in documentation order (memalloc.config_keys()).
const std::vector<std::string>& settings_keys();
// Parses "key:value,..." text (an empty text gives the defaults). Throws
// InvalidArgument naming a malformed entry, an unknown key (with the valid
// ones) or a bad value.
Settings parse_settings(const std::string& text);
// The canonical text of `s`.
std::string settings_text(const Settings& s);

}  // namespace memalloc
