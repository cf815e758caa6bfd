#pragma once
// Metrics an operator scrapes: counters, gauges and histograms, each in a family of one name and
// label sets, rendered in Prometheus's text exposition format (version 0.0.4). Names and units
// follow Prometheus's conventions: snake_case with a `starling_` prefix, a counter's name ends in
// `_total`, seconds and bytes are named so (`_seconds`, `_bytes`). The process's own metrics
// (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...; Linux's /proc) are rendered
// with every scrape, as Prometheus's client libraries name them.
//
// Thread safety: any thread may create a metric or change one (values are atomics; families and
// label sets sit behind the registry's mutex, taken only to create or render); a metric's
// reference stays valid as long as its registry. render() sees each value at some moment during
// the call (not one snapshot of all).
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace starling::ops {

// Label names and values, in the order given (a family's label sets must use the same names).
using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void inc(double by = 1.0);  // by >= 0 (a negative or non-finite step is ignored)
  // Raises the count to `total` when it is higher (a counter mirrored from a cumulative count
  // elsewhere: it never goes down).
  void raiseTo(double total);
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0.0};
};

class Gauge {
 public:
  void set(double v) { v_.store(v, std::memory_order_relaxed); }
  void add(double by) { v_.fetch_add(by, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0.0};
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, strictly increasing and finite (+Inf is implied).
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);  // a non-finite value is ignored
  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts per bound (then +Inf), the sum and the count, read together.
  struct Snapshot {
    std::vector<uint64_t> cumulative;
    double sum = 0.0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, +Inf last
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

// Exponential bucket bounds: start, start x factor, ... (`count` of them).
std::vector<double> exponentialBuckets(double start, double factor, size_t count);

class Registry {
 public:
  Registry();
  // The metric of `name` with `labels`, created on first use. InvalidArgument for a name or label
  // that Prometheus would refuse ([a-zA-Z_:][a-zA-Z0-9_:]*; labels [a-zA-Z_][a-zA-Z0-9_]*, not
  // starting with "__", no label named "le" on a histogram), a counter not ending in _total, a
  // name already registered as another type (or another histogram's buckets), or labels of other
  // names than the family's first set.
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help,
                       const std::vector<double>& bounds, const Labels& labels = {});

  // Every family, sorted by name, in the text exposition format; then the process's metrics
  // unless `with_process` is false.
  std::string render(bool with_process = true) const;

 private:
  enum class Type : uint8_t { kCounter, kGauge, kHistogram };
  struct Family {
    Type type;
    std::string help;
    std::vector<std::string> label_names;
    std::vector<double> bounds;  // histograms
    std::map<std::vector<std::string>, std::unique_ptr<Counter>> counters;
    std::map<std::vector<std::string>, std::unique_ptr<Gauge>> gauges;
    std::map<std::vector<std::string>, std::unique_ptr<Histogram>> histograms;
  };
  Family& family(const std::string& name, Type type, const std::string& help, const Labels& labels,
                 const std::vector<double>& bounds, std::vector<std::string>& values);
  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
  double start_time_;  // seconds since the epoch: process_start_time_seconds
};

// A value as the text format writes it: integers without a fraction, +Inf, -Inf, NaN.
std::string formatValue(double v);
// A label value or help text escaped for the text format (backslash, double quote in labels,
// newline).
std::string escapeLabelValue(const std::string& v);
std::string escapeHelp(const std::string& v);

}  // namespace starling::ops
