// settings.cpp — the settings text's Python-layer keys, and the whole text
// parsed and written in one order (settings.h).
#include "boundary/python/settings.h"

#include <map>

#include "common/errors.h"

namespace memalloc {
namespace {

// The Options' keys, each with the core key it comes before in
// documentation order.
const std::vector<std::pair<std::string, std::string>>& option_places() {
  static const std::vector<std::pair<std::string, std::string>> places = {
      {"backend", "max_split_size_mb"},        {"empty_cache_every_n_steps", "host_capacity_mb"},
      {"patch_torch", "host_capacity_mb"},     {"record_history", "host_capacity_mb"},
      {"record_stacks", "host_capacity_mb"},   {"call_sites", "host_capacity_mb"},
      {"flight_recorder", "host_capacity_mb"}, {"flight_recorder_keep", "host_capacity_mb"}};
  return places;
}

bool apply_option_key(Options& o, const std::string& key, const std::string& value) {
  if (key == "backend") {
    MEMALLOC_EXPECTS(value == "auto" || value == "cuda" || value == "host",
                     "MEMALLOC_CONF: backend '" + value + "' is unknown; use one of auto, cuda, host");
    o.backend = value;
  } else if (key == "patch_torch") {
    o.patch_torch = parse_config_bool(key, value);
  } else if (key == "empty_cache_every_n_steps") {
    o.empty_cache_every_n_steps = parse_config_uint(key, value);
  } else if (key == "record_history") {
    o.record_history = parse_config_uint(key, value);
    MEMALLOC_EXPECTS(o.record_history <= kMaxTraceRecords,
                     "MEMALLOC_CONF: record_history " + value + " is too large: at most " +
                         std::to_string(kMaxTraceRecords) + " records per device");
  } else if (key == "record_stacks") {
    MEMALLOC_EXPECTS(value == "none" || value == "tags" || value == "python",
                     "MEMALLOC_CONF: record_stacks '" + value + "' is unknown; use one of none, tags, python");
    o.record_stacks = value;
  } else if (key == "call_sites") {
    o.call_sites = parse_config_bool(key, value);
  } else if (key == "flight_recorder") {
    MEMALLOC_EXPECTS(!value.empty() && value.find(',') == std::string::npos,
                     "MEMALLOC_CONF: flight_recorder needs a directory without commas, e.g. "
                     "flight_recorder:/tmp/memalloc-flight (got '" +
                         value + "')");
    o.flight_recorder = value;
  } else if (key == "flight_recorder_keep") {
    o.flight_recorder_keep = parse_config_bool(key, value);
  } else {
    return false;
  }
  return true;
}

// The Options' entries that differ from the defaults (backend always).
std::vector<std::pair<std::string, std::string>> option_entries(const Options& o) {
  const Options d;
  std::vector<std::pair<std::string, std::string>> out = {{"backend", o.backend}};
  if (o.empty_cache_every_n_steps != d.empty_cache_every_n_steps)
    out.emplace_back("empty_cache_every_n_steps", std::to_string(o.empty_cache_every_n_steps));
  if (o.patch_torch != d.patch_torch) out.emplace_back("patch_torch", o.patch_torch ? "True" : "False");
  if (o.record_history != d.record_history) out.emplace_back("record_history", std::to_string(o.record_history));
  if (o.record_stacks != d.record_stacks) out.emplace_back("record_stacks", o.record_stacks);
  if (o.call_sites != d.call_sites) out.emplace_back("call_sites", o.call_sites ? "True" : "False");
  if (o.flight_recorder != d.flight_recorder) out.emplace_back("flight_recorder", o.flight_recorder);
  if (o.flight_recorder_keep != d.flight_recorder_keep)
    out.emplace_back("flight_recorder_keep", o.flight_recorder_keep ? "True" : "False");
  return out;
}

}  // namespace

const std::vector<std::string>& settings_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for (const std::string& core : config_keys()) {
      for (const auto& [key, before] : option_places())
        if (before == core) out.push_back(key);
      out.push_back(core);
    }
    return out;
  }();
  return keys;
}

Settings parse_settings(const std::string& text) {
  check_config_entries(text);
  Settings s;
  for (const auto& [key, value] : config_entries(text))
    MEMALLOC_EXPECTS(apply_config_key(s.config, key, value) || apply_option_key(s.options, key, value),
                     unknown_config_key(key, settings_keys()));
  return s;
}

std::string settings_text(const Settings& s) {
  std::map<std::string, std::string> value;
  for (const auto& [key, v] : config_entries(s.config.to_string())) value[key] = v;
  for (const auto& [key, v] : option_entries(s.options)) value[key] = v;
  std::string out;
  for (const std::string& key : settings_keys()) {
    auto it = value.find(key);
    if (it != value.end()) out += (out.empty() ? "" : ",") + key + ":" + it->second;
  }
  return out;
}

}  // namespace memalloc
