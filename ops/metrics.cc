#include "ops/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace starling::ops {

namespace {

bool validName(const std::string& n, bool colon) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
    const bool digit = c >= '0' && c <= '9';
    if (!(alpha || (i > 0 && digit))) return false;
  }
  return true;
}

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

const char* typeName(int t) {
  switch (t) {
    case 0:
      return "counter";
    case 1:
      return "gauge";
    default:
      return "histogram";
  }
}

// `{a="x",b="y"}` (empty without labels), with `extra` (a histogram's le) last.
std::string labelText(const std::vector<std::string>& names, const std::vector<std::string>& values,
                      const std::string& extra = {}) {
  if (names.empty() && extra.empty()) return {};
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += ',';
    out += names[i] + "=\"" + escapeLabelValue(values[i]) + '"';
  }
  if (!extra.empty()) out += (names.empty() ? "" : ",") + extra;
  return out + '}';
}

// /proc/self/stat's fields after the command (which may hold spaces and parentheses).
std::vector<std::string> procStatFields() {
  std::ifstream f("/proc/self/stat");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = all.rfind(')');
  std::vector<std::string> out;
  if (close == std::string::npos) return out;
  std::istringstream rest(all.substr(close + 1));
  for (std::string w; rest >> w;) out.push_back(w);
  return out;  // out[0] is field 3 (state)
}

double bootTime() {
  std::ifstream f("/proc/stat");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("btime ", 0) == 0) return std::stod(line.substr(6));
  return 0.0;
}

size_t openFds() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (const dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n > 0 ? n - 1 : 0;  // less the one opendir holds
}

double processStartTime() {
  const auto f = procStatFields();
  const long ticks = sysconf(_SC_CLK_TCK);
  if (f.size() < 20 || ticks <= 0) return 0.0;
  return bootTime() + std::stod(f[19]) / static_cast<double>(ticks);  // field 22: starttime
}

void appendProcess(std::string& out, double start_time) {
  const auto f = procStatFields();
  const long ticks = sysconf(_SC_CLK_TCK);
  const long page = sysconf(_SC_PAGESIZE);
  const auto metric = [&](const char* name, const char* type, const char* help, double v) {
    out += std::string("# HELP ") + name + ' ' + help + "\n# TYPE " + name + ' ' + type + '\n' +
           name + ' ' + formatValue(v) + '\n';
  };
  if (f.size() >= 22 && ticks > 0) {
    // Fields 14 and 15 (utime, stime) in clock ticks; 23 vsize in bytes; 24 rss in pages.
    const double cpu = (std::stod(f[11]) + std::stod(f[12])) / static_cast<double>(ticks);
    metric("process_cpu_seconds_total", "counter",
           "Total user and system CPU time spent in seconds.", cpu);
    metric("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
           std::stod(f[20]));
    metric("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
           std::stod(f[21]) * static_cast<double>(page));
  }
  metric("process_start_time_seconds", "gauge",
         "Start time of the process since unix epoch in seconds.", start_time);
  metric("process_open_fds", "gauge", "Number of open file descriptors.",
         static_cast<double>(openFds()));
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY)
    metric("process_max_fds", "gauge", "Maximum number of open file descriptors.",
           static_cast<double>(lim.rlim_cur));
}

}  // namespace

std::string formatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  // The shortest of 15 to 17 digits that reads back as the same double (0.1, not 0.1000...01).
  char buf[40];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string escapeLabelValue(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escapeHelp(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void Counter::inc(double by) {
  if (!(by >= 0.0) || !std::isfinite(by)) return;
  v_.fetch_add(by, std::memory_order_relaxed);
}

void Counter::raiseTo(double total) {
  if (!std::isfinite(total)) return;
  double cur = v_.load(std::memory_order_relaxed);
  while (total > cur && !v_.compare_exchange_weak(cur, total, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    STARLING_CHECK_ARG(std::isfinite(bounds_[i]), "histogram bucket bound ", bounds_[i],
                       " is not finite (+Inf is implied)");
    STARLING_CHECK_ARG(i == 0 || bounds_[i] > bounds_[i - 1],
                       "histogram bucket bounds must increase strictly");
  }
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::observe(double v) {
  if (!std::isfinite(v)) return;
  const size_t b =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[b];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  Snapshot s;
  s.cumulative.resize(counts_.size());
  uint64_t run = 0;
  for (size_t i = 0; i < counts_.size(); ++i) s.cumulative[i] = run += counts_[i];
  s.sum = sum_;
  s.count = count_;
  return s;
}

std::vector<double> exponentialBuckets(double start, double factor, size_t count) {
  STARLING_CHECK_ARG(start > 0 && factor > 1 && count >= 1, "exponential buckets: start ", start,
                     ", factor ", factor, ", count ", count);
  std::vector<double> b(count);
  double v = start;
  for (size_t i = 0; i < count; ++i, v *= factor) b[i] = v;
  return b;
}

Registry::Registry() : start_time_(processStartTime()) {}

Registry::Family& Registry::family(const std::string& name, Type type, const std::string& help,
                                   const Labels& labels, const std::vector<double>& bounds,
                                   std::vector<std::string>& values) {
  STARLING_CHECK_ARG(validName(name, true), "metric name '", name,
                     "' is not [a-zA-Z_:][a-zA-Z0-9_:]*");
  STARLING_CHECK_ARG(type != Type::kCounter || endsWith(name, "_total"), "counter '", name,
                     "' must end in _total");
  std::vector<std::string> names;
  for (const auto& [k, v] : labels) {
    STARLING_CHECK_ARG(validName(k, false) && k.rfind("__", 0) != 0, "metric ", name, ": label '",
                       k, "' is not a valid label name");
    STARLING_CHECK_ARG(type != Type::kHistogram || k != "le", "histogram ", name,
                       ": 'le' is reserved for its buckets");
    STARLING_CHECK_ARG(std::find(names.begin(), names.end(), k) == names.end(), "metric ", name,
                       ": label '", k, "' given twice");
    names.push_back(k);
    values.push_back(v);
  }
  auto [it, fresh] = families_.try_emplace(name);
  Family& f = it->second;
  if (fresh) {
    f.type = type;
    f.help = help;
    f.label_names = names;
    f.bounds = bounds;
    return f;
  }
  STARLING_CHECK_ARG(f.type == type, "metric ", name, " is a ", typeName(static_cast<int>(f.type)),
                     ", not a ", typeName(static_cast<int>(type)));
  STARLING_CHECK_ARG(f.label_names == names, "metric ", name,
                     ": every label set must name the same labels");
  STARLING_CHECK_ARG(f.bounds == bounds, "histogram ", name, ": another set of buckets");
  return f;
}

Counter& Registry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> values;
  Family& f = family(name, Type::kCounter, help, labels, {}, values);
  auto& slot = f.counters[values];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& Registry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> values;
  Family& f = family(name, Type::kGauge, help, labels, {}, values);
  auto& slot = f.gauges[values];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& Registry::histogram(const std::string& name, const std::string& help,
                               const std::vector<double>& bounds, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> values;
  Family& f = family(name, Type::kHistogram, help, labels, bounds, values);
  auto& slot = f.histograms[values];
  if (!slot) slot = std::make_unique<Histogram>(bounds);
  return *slot;
}

std::string Registry::render(bool with_process) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, f] : families_) {
      out += "# HELP " + name + ' ' + escapeHelp(f.help) + '\n';
      out += "# TYPE " + name + ' ' + typeName(static_cast<int>(f.type)) + '\n';
      for (const auto& [values, c] : f.counters)
        out += name + labelText(f.label_names, values) + ' ' + formatValue(c->value()) + '\n';
      for (const auto& [values, g] : f.gauges)
        out += name + labelText(f.label_names, values) + ' ' + formatValue(g->value()) + '\n';
      for (const auto& [values, h] : f.histograms) {
        const Histogram::Snapshot s = h->snapshot();
        for (size_t i = 0; i < s.cumulative.size(); ++i) {
          const std::string le =
              "le=\"" + (i < f.bounds.size() ? formatValue(f.bounds[i]) : std::string("+Inf")) +
              '"';
          out += name + "_bucket" + labelText(f.label_names, values, le) + ' ' +
                 formatValue(static_cast<double>(s.cumulative[i])) + '\n';
        }
        out += name + "_sum" + labelText(f.label_names, values) + ' ' + formatValue(s.sum) + '\n';
        out += name + "_count" + labelText(f.label_names, values) + ' ' +
               formatValue(static_cast<double>(s.count)) + '\n';
      }
    }
  }
  if (with_process) appendProcess(out, start_time_);
  return out;
}

}  // namespace starling::ops
