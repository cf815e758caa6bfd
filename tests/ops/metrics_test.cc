// ops/metrics.h: the text exposition a Prometheus server reads, checked line by line against the
// format's rules (docs: "Exposition formats", version 0.0.4), the registry's refusals, and values
// changed from many threads while another renders. tools/prom_parse.py (Prometheus's own Python
// parser) reads the same text in tests/python/test_operations.py.
#include "ops/metrics.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

#include "core/error.h"

using namespace starling;
using namespace starling::ops;

namespace {

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

bool has(const std::string& text, const std::string& line) {
  for (const auto& l : lines(text))
    if (l == line) return true;
  return false;
}

// The value on the line that starts with `series` and a space; NaN when there is none.
double valueOf(const std::string& text, const std::string& series) {
  for (const auto& l : lines(text))
    if (l.rfind(series + " ", 0) == 0) return std::stod(l.substr(series.size() + 1));
  return std::nan("");
}

}  // namespace

TEST_CASE("metrics render in Prometheus's text format, one family per name", "[ops]") {
  Registry r;
  r.counter("starling_updates_total", "Updates, by result.", {{"result", "accepted"}}).inc(3);
  r.counter("starling_updates_total", "Updates, by result.", {{"result", "refused"}}).inc();
  r.gauge("starling_round", "The round.").set(7);
  r.gauge("starling_eval_accuracy", "Accuracy.").set(0.8125);
  r.gauge("starling_eval_loss", "Loss.").set(std::numeric_limits<double>::quiet_NaN());
  const std::string t = r.render(false);
  INFO(t);
  // HELP and TYPE once per family, before its samples; families sorted by name.
  CHECK(has(t, "# HELP starling_updates_total Updates, by result."));
  CHECK(has(t, "# TYPE starling_updates_total counter"));
  CHECK(has(t, "starling_updates_total{result=\"accepted\"} 3"));
  CHECK(has(t, "starling_updates_total{result=\"refused\"} 1"));
  CHECK(has(t, "# TYPE starling_round gauge"));
  CHECK(has(t, "starling_round 7"));
  CHECK(has(t, "starling_eval_accuracy 0.8125"));
  CHECK(has(t, "starling_eval_loss NaN"));
  const auto ls = lines(t);
  size_t helps = 0;
  for (const auto& l : ls) helps += l.rfind("# HELP starling_updates_total ", 0) == 0;
  CHECK(helps == 1);
  CHECK(t.find("# TYPE starling_eval_accuracy") < t.find("# TYPE starling_round"));
  CHECK(t.back() == '\n');
  CHECK(t.find("process_") == std::string::npos);  // without the process's own
}

TEST_CASE("label values and help text are escaped and values written as the format reads them",
          "[ops]") {
  Registry r;
  r.gauge("g", "a \\ backslash\nand a newline", {{"l", "quote \" back \\ new\nline"}}).set(1);
  const std::string t = r.render(false);
  INFO(t);
  CHECK(has(t, "# HELP g a \\\\ backslash\\nand a newline"));
  CHECK(has(t, "g{l=\"quote \\\" back \\\\ new\\nline\"} 1"));
  CHECK(formatValue(0.1) == "0.1");
  CHECK(std::stod(formatValue(1.0 / 3.0)) == 1.0 / 3.0);  // reads back exactly
  CHECK(formatValue(-2) == "-2");
  CHECK(formatValue(1e300) == std::string("1e+300"));
  CHECK(formatValue(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(formatValue(-std::numeric_limits<double>::infinity()) == "-Inf");
}

TEST_CASE("a histogram's buckets are cumulative, a value on a bound counts in that bucket",
          "[ops]") {
  Registry r;
  Histogram& h = r.histogram("starling_round_duration_seconds", "Round time.", {0.5, 1, 2},
                             {{"role", "root"}});
  for (double v : {0.1, 0.5, 0.7, 1.0, 1.5, 3.0, 100.0}) h.observe(v);
  h.observe(std::nan(""));  // ignored
  const std::string t = r.render(false);
  INFO(t);
  CHECK(has(t, "# TYPE starling_round_duration_seconds histogram"));
  CHECK(has(t, "starling_round_duration_seconds_bucket{role=\"root\",le=\"0.5\"} 2"));
  CHECK(has(t, "starling_round_duration_seconds_bucket{role=\"root\",le=\"1\"} 4"));
  CHECK(has(t, "starling_round_duration_seconds_bucket{role=\"root\",le=\"2\"} 5"));
  CHECK(has(t, "starling_round_duration_seconds_bucket{role=\"root\",le=\"+Inf\"} 7"));
  CHECK(has(t, "starling_round_duration_seconds_count{role=\"root\"} 7"));
  CHECK(valueOf(t, "starling_round_duration_seconds_sum{role=\"root\"}") ==
        Approx(0.1 + 0.5 + 0.7 + 1.0 + 1.5 + 3.0 + 100.0));
  CHECK(exponentialBuckets(0.05, 2, 3) == std::vector<double>{0.05, 0.1, 0.2});
}

TEST_CASE("a counter never goes down", "[ops]") {
  Counter c;
  c.inc(5);
  c.inc(-3);  // ignored
  c.inc(std::numeric_limits<double>::infinity());
  CHECK(c.value() == 5);
  c.raiseTo(9);
  c.raiseTo(4);  // a lower total: ignored
  CHECK(c.value() == 9);
}

TEST_CASE("the registry refuses what Prometheus would", "[ops]") {
  Registry r;
  CHECK_THROWS_AS(r.counter("starling_updates", "no _total"), InvalidArgument);
  CHECK_THROWS_AS(r.gauge("1bad", "a digit first"), InvalidArgument);
  CHECK_THROWS_AS(r.gauge("bad-name", "a dash"), InvalidArgument);
  CHECK_THROWS_AS(r.gauge("g", "", {{"__reserved", "x"}}), InvalidArgument);
  CHECK_THROWS_AS(r.gauge("g", "", {{"a", "x"}, {"a", "y"}}), InvalidArgument);
  CHECK_THROWS_AS(r.histogram("h", "", {1, 2}, {{"le", "x"}}), InvalidArgument);
  CHECK_THROWS_AS(r.histogram("h2", "", {2, 1}), InvalidArgument);
  r.gauge("starling_x", "x", {{"a", "1"}});
  CHECK_THROWS_AS(r.counter("starling_x", "x"), InvalidArgument);  // another type (not _total)
  CHECK_THROWS_AS(r.gauge("starling_x", "x", {{"b", "1"}}), InvalidArgument);  // other labels
  r.counter("starling_y_total", "y");
  CHECK_THROWS_AS(r.gauge("starling_y_total", "y"), InvalidArgument);
  r.histogram("starling_h", "h", {1, 2});
  CHECK_THROWS_AS(r.histogram("starling_h", "h", {1, 3}), InvalidArgument);
  // The same name and labels give the same metric.
  r.gauge("starling_x", "x", {{"a", "1"}}).set(2);
  CHECK(r.gauge("starling_x", "x", {{"a", "1"}}).value() == 2);
}

TEST_CASE("the process's own metrics come with every scrape", "[ops]") {
  Registry r;
  std::vector<char> touched(64 << 20, 1);  // 64 MiB resident
  const std::string t = r.render();
  INFO(t.substr(0, 2000));
  CHECK(has(t, "# TYPE process_cpu_seconds_total counter"));
  CHECK(valueOf(t, "process_resident_memory_bytes") >= 64.0 * (1 << 20));
  CHECK(valueOf(t, "process_virtual_memory_bytes") >= valueOf(t, "process_resident_memory_bytes"));
  CHECK(valueOf(t, "process_open_fds") >= 3);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double start = valueOf(t, "process_start_time_seconds");
  CHECK(start <= now + 1);
  CHECK(start > now - 24 * 3600);  // this test process started today
  CHECK(touched[12345] == 1);
}

TEST_CASE("values changed from many threads while another renders are all counted", "[ops]") {
  Registry r;
  std::atomic<bool> stop{false};
  size_t renders = 0;
  std::thread reader([&] {
    while (!stop.load()) {
      (void)r.render(false);
      ++renders;
    }
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w)
    writers.emplace_back([&r, w] {
      for (int i = 0; i < 20000; ++i) {
        r.counter("starling_t_total", "t", {{"w", std::to_string(i % 3)}}).inc();
        r.histogram("starling_h", "h", {1.0}).observe(w);
      }
    });
  for (auto& t : writers) t.join();
  stop = true;
  reader.join();
  const std::string t = r.render(false);
  double sum = 0;
  for (int k = 0; k < 3; ++k)
    sum += valueOf(t, "starling_t_total{w=\"" + std::to_string(k) + "\"}");
  CHECK(sum == 80000);
  CHECK(valueOf(t, "starling_h_count") == 80000);
  CHECK(valueOf(t, "starling_h_bucket{le=\"1\"}") == 40000);  // writers 0 and 1
  CHECK(renders > 0);
}
