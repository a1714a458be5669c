// config.cpp — parsing of MEMALLOC_CONF-style text into an immutable Config.
//
// Only the core's keys live here (the allocator's and the host backend's);
// the Python layer's keys are parsed by the module that serves it
// (boundary/python/settings.*), with the same splitter and value parsers.
//
// Invariants: parse_config(c.to_string()) == c for every valid Config c;
// a rejected text leaves nothing behind (parsing has no side effects).
#include "common/config.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "common/errors.h"

namespace memalloc {

// Parses a non-negative decimal integer or throws naming key and value.
size_t parse_config_uint(const std::string& key, const std::string& value) {
  bool ok = !value.empty() && value.find_first_not_of("0123456789") == std::string::npos;
  errno = 0;
  unsigned long long v = ok ? std::strtoull(value.c_str(), nullptr, 10) : 0;
  MEMALLOC_EXPECTS(ok && errno == 0, "MEMALLOC_CONF: value '" + value + "' of key '" + key +
                                         "' is not a non-negative integer; write e.g. '" + key + ":256'");
  return static_cast<size_t>(v);
}

bool parse_config_bool(const std::string& key, const std::string& value) {
  if (value == "1" || value == "true" || value == "True") return true;
  if (value == "0" || value == "false" || value == "False") return false;
  MEMALLOC_EXPECTS(false, "MEMALLOC_CONF: value '" + value + "' of key '" + key + "' is not a boolean; write " + key +
                              ":True or " + key + ":False");
  return false;
}

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kMinMaxSplitMiB = 20;       // native: must exceed kLargeBuffer
constexpr size_t kMaxMiB = size_t{1} << 40;  // 1 EiB: mb * kMiB cannot overflow

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\n");
  return s.substr(b, e - b + 1);
}

// Parses a size in MiB and returns bytes; rejects values whose byte count
// would not fit (so to_string() round-trips).
size_t parse_mib(const std::string& key, const std::string& value) {
  size_t mb = parse_config_uint(key, value);
  MEMALLOC_EXPECTS(mb <= kMaxMiB, "MEMALLOC_CONF: value " + value + " of key '" + key + "' is too large (at most " +
                                      std::to_string(kMaxMiB) + ")");
  return mb * kMiB;
}

// Parses a real number in [lo, hi) or throws naming key and value.
double parse_real(const std::string& key, const std::string& value, double lo, double hi, const std::string& expected) {
  char* end = nullptr;
  errno = 0;
  double v = value.empty() ? 0.0 : std::strtod(value.c_str(), &end);
  bool ok = !value.empty() && end == value.c_str() + value.size() && errno == 0 && v >= lo && v < hi;
  MEMALLOC_EXPECTS(ok, "MEMALLOC_CONF: value '" + value + "' of key '" + key + "' is invalid; " + expected);
  return v;
}

// Shortest decimal text that parses back to exactly v.
std::string real_text(double v) {
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

size_t parse_one_division(const std::string& value) {
  size_t d = parse_config_uint("roundup_power2_divisions", value);
  MEMALLOC_EXPECTS(d <= 64 && (d & (d - 1)) == 0,
                   "MEMALLOC_CONF: roundup_power2_divisions must be a power of two "
                   "between 1 and 64, or 0 to disable (got " +
                       value + ")");
  return d <= 1 ? 0 : d;
}

// One value for every size, or torch's list "[<MiB>:<divisions>,...,>:<d>]":
// an entry sets the interval holding its bound, the first also every smaller
// one, ">" every interval after the previous entry (native semantics).
void parse_divisions(Config& c, const std::string& value) {
  if (value.empty() || value.front() != '[') {
    c.roundup_power2_divisions.fill(parse_one_division(value));
    return;
  }
  MEMALLOC_EXPECTS(value.back() == ']', "MEMALLOC_CONF: roundup_power2_divisions list '" + value +
                                            "' has no closing ']'; write e.g. [64:8,256:4,>:1]");
  std::stringstream ss(value.substr(1, value.size() - 2));
  std::string entry;
  bool first = true;
  size_t last = 0;
  while (std::getline(ss, entry, ',')) {
    const size_t colon = entry.find(':');
    MEMALLOC_EXPECTS(colon != std::string::npos, "MEMALLOC_CONF: roundup_power2_divisions entry '" + entry +
                                                     "' is not <MiB>:<divisions>; write e.g. [64:8,>:1]");
    const std::string bound = trim(entry.substr(0, colon));
    const size_t d = parse_one_division(trim(entry.substr(colon + 1)));
    if (bound == ">") {
      std::fill(c.roundup_power2_divisions.begin() + static_cast<std::ptrdiff_t>(first ? 0 : last + 1),
                c.roundup_power2_divisions.end(), d);
      continue;
    }
    const size_t mib = parse_config_uint("roundup_power2_divisions", bound);
    MEMALLOC_EXPECTS(mib > 0 && (mib & (mib - 1)) == 0,
                     "MEMALLOC_CONF: roundup_power2_divisions bound " + bound + " is not a power of two (MiB)");
    const size_t index = std::min<size_t>(63 - static_cast<size_t>(__builtin_clzll(mib)), kRoundupIntervals - 1);
    if (first)
      std::fill(c.roundup_power2_divisions.begin(),
                c.roundup_power2_divisions.begin() + static_cast<std::ptrdiff_t>(index), d);
    c.roundup_power2_divisions[index] = d;
    last = index;
    first = false;
  }
}

// Splits "k:v,k:[a,b],..." at the commas outside brackets.
std::vector<std::string> split_entries(const std::string& text) {
  std::vector<std::string> out(1);
  int depth = 0;
  for (char ch : text) {
    if (ch == '[') ++depth;
    if (ch == ']') --depth;
    if (ch == ',' && depth <= 0) {
      out.emplace_back();
    } else {
      out.back() += ch;
    }
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> config_entries(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& item : split_entries(text)) {
    if (trim(item).empty()) continue;
    const size_t colon = item.find(':');
    if (colon == std::string::npos) {
      out.emplace_back(trim(item), "");
    } else {
      out.emplace_back(trim(item.substr(0, colon)), trim(item.substr(colon + 1)));
    }
  }
  return out;
}

bool apply_config_key(Config& c, const std::string& key, const std::string& value) {
  if (key == "max_split_size_mb") {
    size_t bytes = parse_mib(key, value);
    MEMALLOC_EXPECTS(bytes > kMinMaxSplitMiB * kMiB, "MEMALLOC_CONF: max_split_size_mb must be greater than " +
                                                         std::to_string(kMinMaxSplitMiB) + " (got " + value + ")");
    c.max_split_size = bytes;
  } else if (key == "roundup_power2_divisions") {
    parse_divisions(c, value);
  } else if (key == "garbage_collection_threshold") {
    c.garbage_collection_threshold =
        parse_real(key, value, 0.0, 1.0, "use a fraction in (0, 1), e.g. 0.8, or 0 for off");
  } else if (key == "expandable_segments") {
    c.expandable_segments = parse_config_bool(key, value);
  } else if (key == "graph_capture_record_stream_reuse") {
    c.graph_capture_record_stream_reuse = parse_config_bool(key, value);
  } else if (key == "reuse_free_pages") {
    c.reuse_free_pages = parse_config_bool(key, value);
  } else if (key == "host_capacity_mb") {
    size_t bytes = parse_mib(key, value);
    MEMALLOC_EXPECTS(bytes > 0, "MEMALLOC_CONF: host_capacity_mb must be positive");
    c.host_capacity = bytes;
  } else if (key == "host_devices") {
    size_t n = parse_config_uint(key, value);
    MEMALLOC_EXPECTS(n >= 1 && n <= 64, "MEMALLOC_CONF: host_devices must be between 1 and 64 (got " + value + ")");
    c.host_devices = static_cast<int>(n);
  } else {
    return false;
  }
  return true;
}

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = {"max_split_size_mb",
                                                "roundup_power2_divisions",
                                                "garbage_collection_threshold",
                                                "expandable_segments",
                                                "graph_capture_record_stream_reuse",
                                                "reuse_free_pages",
                                                "host_capacity_mb",
                                                "host_devices"};
  return keys;
}

void check_config_entries(const std::string& text) {
  for (const std::string& item : split_entries(text)) {
    if (trim(item).empty()) continue;
    MEMALLOC_EXPECTS(item.find(':') != std::string::npos,
                     "MEMALLOC_CONF: entry '" + trim(item) +
                         "' has no ':'; write key:value pairs separated by commas, "
                         "e.g. 'max_split_size_mb:256,backend:host'");
  }
}

std::string unknown_config_key(const std::string& key, const std::vector<std::string>& valid) {
  std::string keys;
  for (const auto& k : valid) keys += (keys.empty() ? "" : ", ") + k;
  return "MEMALLOC_CONF: unknown key '" + key + "'; valid keys are: " + keys;
}

Config parse_config(const std::string& text) {
  check_config_entries(text);
  Config c;
  for (const auto& [key, value] : config_entries(text))
    MEMALLOC_EXPECTS(apply_config_key(c, key, value), unknown_config_key(key, config_keys()));
  return c;
}

std::string Config::to_string() const {
  std::string s;
  if (max_split_size != static_cast<size_t>(-1)) s += ",max_split_size_mb:" + std::to_string(max_split_size / kMiB);
  const auto& d = roundup_power2_divisions;
  if (std::all_of(d.begin(), d.end(), [&](size_t v) { return v == d[0]; })) {
    if (d[0]) s += ",roundup_power2_divisions:" + std::to_string(d[0]);
  } else {  // every interval, by its bound in MiB
    s += ",roundup_power2_divisions:[";
    for (size_t i = 0; i < kRoundupIntervals; ++i)
      s += (i ? "," : "") + std::to_string(size_t{1} << i) + ":" + std::to_string(d[i]);
    s += "]";
  }
  if (garbage_collection_threshold > 0.0)
    s += ",garbage_collection_threshold:" + real_text(garbage_collection_threshold);
  if (expandable_segments) s += ",expandable_segments:True";
  if (graph_capture_record_stream_reuse) s += ",graph_capture_record_stream_reuse:True";
  if (!reuse_free_pages) s += ",reuse_free_pages:False";
  s += ",host_capacity_mb:" + std::to_string(host_capacity / kMiB);
  s += ",host_devices:" + std::to_string(host_devices);
  return s.substr(1);  // without the first comma
}

}  // namespace memalloc
