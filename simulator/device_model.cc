#include "simulator/device_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"

namespace starling::simulator {

namespace {

// One data row of a CSV file: its line number, the line, and its fields.
struct CsvRow {
  size_t line = 0;
  std::string text;
  std::vector<std::string> fields;
};

ConfigError csvError(const std::string& path, size_t line, const std::string& what) {
  return ConfigError(path + ":" + std::to_string(line) + ": " + what);
}

// The rows of a CSV file whose first line that is neither blank nor a comment ('#') is `header`,
// each of exactly `n` comma-separated fields. IoError for an unreadable file, ConfigError naming
// the line for another header or another number of fields.
std::vector<CsvRow> readCsv(const std::string& path, const char* what, const std::string& header,
                            size_t n) {
  std::ifstream in(path);
  if (!in) STARLING_THROW(IoError, "cannot open the ", what, " ", path);
  std::vector<CsvRow> rows;
  std::string line;
  size_t lineno = 0;
  bool seen_header = false;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    if (!seen_header) {
      if (line != header)
        throw csvError(path, lineno, "the header must be '" + header + "', got '" + line + "'");
      seen_header = true;
      continue;
    }
    CsvRow row{lineno, line, {}};
    std::stringstream ss(line);
    std::string f;
    while (std::getline(ss, f, ',')) row.fields.push_back(f);
    if (!line.empty() && line.back() == ',') row.fields.emplace_back();
    if (row.fields.size() != n)
      throw csvError(path, lineno,
                     "expected " + std::to_string(n) + " comma-separated fields, got " +
                         std::to_string(row.fields.size()));
    rows.push_back(std::move(row));
  }
  if (!seen_header) STARLING_THROW(ConfigError, path, ": no header '", header, "'");
  return rows;
}

// A client id below n, the whole field.
uint64_t csvClient(const std::string& path, const CsvRow& row, size_t n) {
  uint64_t id = 0;
  try {
    size_t used = 0;
    id = std::stoull(row.fields[0], &used);
    if (used != row.fields[0].size() || row.fields[0][0] == '-') throw std::invalid_argument("id");
  } catch (const std::exception&) {
    throw csvError(path, row.line, "not a number in '" + row.text + "'");
  }
  if (id >= n)
    throw csvError(
        path, row.line,
        "client " + std::to_string(id) + " is not below the " + std::to_string(n) + " clients");
  return id;
}

double csvNumber(const std::string& path, const CsvRow& row, size_t i) {
  try {
    size_t used = 0;
    const double v = std::stod(row.fields[i], &used);
    if (used != row.fields[i].size()) throw std::invalid_argument("trailing");
    return v;
  } catch (const std::exception&) {
    throw csvError(path, row.line, "not a number in '" + row.text + "'");
  }
}

}  // namespace

void DeviceDistributions::validate() const {
  if (!(speed_median > 0) || !std::isfinite(speed_median))
    STARLING_THROW(ConfigError, "devices.speed_median must be positive, got ", speed_median);
  if (!(bandwidth_median > 0) || !std::isfinite(bandwidth_median))
    STARLING_THROW(ConfigError, "devices.bandwidth_median must be positive, got ",
                   bandwidth_median);
  if (!(speed_sigma >= 0 && speed_sigma <= 5))
    STARLING_THROW(ConfigError, "devices.speed_sigma must be in [0, 5], got ", speed_sigma);
  if (!(bandwidth_sigma >= 0 && bandwidth_sigma <= 5))
    STARLING_THROW(ConfigError, "devices.bandwidth_sigma must be in [0, 5], got ", bandwidth_sigma);
  if (!(availability > 0 && availability <= 1))
    STARLING_THROW(ConfigError, "devices.availability must be in (0, 1], got ", availability);
}

DevicePopulation DevicePopulation::sample(size_t n, const DeviceDistributions& d, uint64_t seed) {
  d.validate();
  DevicePopulation p;
  p.drawn_ = d;
  p.seed_ = seed;
  p.size_ = n;
  p.always_ = d.availability >= 1.0;
  return p;
}

DeviceProfile DevicePopulation::operator[](uint64_t client) const {
  STARLING_CHECK_ARG(client < size_, "device of client ", client, " of only ", size_);
  if (!devices_.empty()) return devices_[client];
  // One stream per client: a population of n + 1 clients extends, never reshuffles, one of n.
  RngStream rng(StreamKey{seed_, 0, client, StreamPurpose::kClientSampling, 2});
  DeviceProfile dev;
  dev.speed = drawn_.speed_median * std::exp(drawn_.speed_sigma * rng.normal());
  dev.bandwidth = drawn_.bandwidth_median * std::exp(drawn_.bandwidth_sigma * rng.normal());
  dev.availability = drawn_.availability;
  return dev;
}

uint64_t DevicePopulation::fingerprint() const {
  if (fingerprint_) return *fingerprint_;
  // SplitMix64's finaliser over each field in turn, with the counts, so that no two populations
  // of different shape share a sequence of words.
  uint64_t h = 0x6465766963657321ull;  // "devices!"
  const auto mix = [&h](uint64_t v) {
    uint64_t z = (h ^ v) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    h = z ^ (z >> 31);
  };
  const auto bits = [](double x) { return std::bit_cast<uint64_t>(x); };
  mix(size_);
  for (uint64_t c = 0; c < size_; ++c) {
    const DeviceProfile d = (*this)[c];
    mix(bits(d.speed));
    mix(bits(d.bandwidth));
    mix(bits(d.availability));
  }
  mix(windows_.size());
  for (const Windows& w : windows_) {
    mix(bits(w.period));
    mix(w.active.size());
    for (const auto& [start, end] : w.active) {
      mix(bits(start));
      mix(bits(end));
    }
  }
  fingerprint_ = h;
  return h;
}

DevicePopulation DevicePopulation::fromCsv(const std::string& path, size_t n) {
  const std::vector<CsvRow> rows =
      readCsv(path, "device trace", "client,speed,bandwidth,availability", 4);
  DevicePopulation p;
  p.devices_.resize(n);
  p.size_ = n;
  std::vector<bool> seen(n, false);
  for (const CsvRow& row : rows) {
    const uint64_t id = csvClient(path, row, n);
    const double speed = csvNumber(path, row, 1), bw = csvNumber(path, row, 2),
                 av = csvNumber(path, row, 3);
    const auto bad = [&](const std::string& what) { return csvError(path, row.line, what); };
    if (seen[id]) throw bad("client " + std::to_string(id) + " appears twice");
    if (!(speed > 0) || !std::isfinite(speed)) throw bad("speed must be positive");
    if (!(bw > 0) || !std::isfinite(bw)) throw bad("bandwidth must be positive");
    if (!(av >= 0 && av <= 1)) throw bad("availability must be in [0, 1]");
    seen[id] = true;
    p.devices_[id] = DeviceProfile{speed, bw, av};
    p.always_ = p.always_ && av >= 1.0;
  }
  if (rows.size() != n) {
    const auto missing = std::find(seen.begin(), seen.end(), false) - seen.begin();
    STARLING_THROW(ConfigError, path, ": ", rows.size(), " clients, the simulation has ", n,
                   " (client ", missing, " is missing)");
  }
  return p;
}

void DevicePopulation::loadWindows(const std::string& path) {
  const size_t n = size_;
  const std::vector<CsvRow> rows =
      readCsv(path, "availability trace", "client,period,start,end", 4);
  std::vector<Windows> w(n);
  for (const CsvRow& row : rows) {
    const uint64_t id = csvClient(path, row, n);
    const double period = csvNumber(path, row, 1), start = csvNumber(path, row, 2),
                 end = csvNumber(path, row, 3);
    const auto bad = [&](const std::string& what) { return csvError(path, row.line, what); };
    if (!(period > 0) || !std::isfinite(period)) throw bad("period must be positive");
    if (!(start >= 0 && start < end && end <= period))
      throw bad(
          "the interval must satisfy 0 <= start < end <= period (a client online for no "
          "time, or only at the period's end, which t mod period never reaches, is never "
          "online: leave the interval out)");
    if (w[id].period != 0.0 && w[id].period != period)
      throw bad("client " + std::to_string(id) + " has two periods");
    w[id].period = period;
    w[id].active.emplace_back(start, end);
  }
  for (size_t c = 0; c < n; ++c) {
    if (w[c].active.empty())
      STARLING_THROW(ConfigError, path, ": client ", c, " has no interval (every client of the ", n,
                     " must appear)");
    std::sort(w[c].active.begin(), w[c].active.end());
  }
  if (!always_)
    STARLING_THROW(ConfigError, path,
                   ": availability over time replaces the availability probabilities, which must "
                   "be 1 (devices.availability, or the device trace's column)");
  windows_ = std::move(w);
  fingerprint_.reset();
}

bool DevicePopulation::onlineAt(uint64_t client, double t) const {
  if (windows_.empty()) return true;
  const Windows& w = windows_.at(client);
  const double x = std::fmod(t, w.period);
  for (const auto& [start, end] : w.active) {
    if (start > x) break;
    if (x <= end) return true;
  }
  return false;
}

double DevicePopulation::nextOnline(uint64_t client, double t) const {
  if (windows_.empty()) return t;
  const Windows& w = windows_.at(client);
  const double x = std::fmod(t, w.period), base = t - x;
  double next = base + w.period + w.active.front().first;  // the next period's first interval
  for (const auto& [start, end] : w.active) {
    if (x < start) {
      next = base + start;
      break;
    }
    if (x <= end) return t;
  }
  // base + start can round to just before the interval: the first representable time inside it
  // (a time so large that the period's intervals no longer have one: never).
  for (int i = 0; i < 64 && !onlineAt(client, next); ++i)
    next = std::nextafter(next, std::numeric_limits<double>::infinity());
  return onlineAt(client, next) ? next : std::numeric_limits<double>::infinity();
}

double DevicePopulation::longestOnline(uint64_t client) const {
  if (windows_.empty()) return std::numeric_limits<double>::infinity();
  const Windows& w = windows_.at(client);
  double longest = 0.0;
  for (const auto& [start, end] : w.active) {
    const double gone = nextOffline(client, start);  // start is online: end > start
    longest = std::max(longest, gone - start);
  }
  return longest;
}

double DevicePopulation::nextOffline(uint64_t client, double t) const {
  if (windows_.empty()) return std::numeric_limits<double>::infinity();
  if (!onlineAt(client, t)) return t;
  const Windows& w = windows_.at(client);
  // How far the intervals (sorted by start; they may touch or overlap) run on from `from`.
  const auto reach = [&](double from) {
    double end = from;
    for (const auto& [s, e] : w.active)
      if (s <= end && e > end) end = e;
    return end;
  };
  const double x = std::fmod(t, w.period), base = t - x;
  double end = reach(x);
  if (end >= w.period) {  // online up to the period's turn: on into the next period's start
    const double head = reach(0.0);
    if (head >= w.period) return std::numeric_limits<double>::infinity();  // always online
    end = w.period + head;
  }
  return std::nextafter(base + end, std::numeric_limits<double>::infinity());
}

bool DevicePopulation::available(uint64_t client, uint64_t round, uint64_t seed) const {
  if (always_) return true;
  STARLING_CHECK_ARG(client < size_, "device of client ", client, " of only ", size_);
  // A drawn population's availability is the distribution's, the same for every client.
  const double a = devices_.empty() ? drawn_.availability : devices_[client].availability;
  if (a >= 1.0) return true;
  if (a <= 0.0) return false;
  RngStream rng(StreamKey{seed, round, client, StreamPurpose::kClientSampling, 1});
  return rng.uniform() < a;
}

ClientTiming timeClient(const DeviceProfile& d, uint64_t client_id, uint64_t examples,
                        uint32_t epochs, double reference_seconds_per_example,
                        uint64_t downlink_bytes, uint64_t uplink_bytes) {
  ClientTiming t;
  t.client_id = client_id;
  t.compute_seconds = static_cast<double>(examples) * static_cast<double>(epochs) *
                      reference_seconds_per_example / d.speed;
  t.transfer_seconds = static_cast<double>(downlink_bytes + uplink_bytes) / d.bandwidth;
  return t;
}

RoundTiming simulateRound(std::span<const ClientTiming> clients, size_t target,
                          double deadline_seconds) {
  std::vector<const ClientTiming*> order;
  for (const auto& c : clients) order.push_back(&c);
  std::sort(order.begin(), order.end(), [](const ClientTiming* a, const ClientTiming* b) {
    if (a->total() != b->total()) return a->total() < b->total();
    return a->client_id < b->client_id;
  });
  RoundTiming r;
  for (const ClientTiming* c : order) {
    const bool in_time = deadline_seconds <= 0 || c->total() <= deadline_seconds;
    if (in_time && r.accepted.size() < target) {
      r.accepted.push_back(c->client_id);
      r.seconds = c->total();
    } else {
      r.dropped.push_back(c->client_id);
    }
  }
  // With nobody accepted, the round still took until the deadline (or the slowest client).
  if (r.accepted.empty() && !order.empty())
    r.seconds = deadline_seconds > 0 ? deadline_seconds : order.back()->total();
  return r;
}

}  // namespace starling::simulator
