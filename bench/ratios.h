#pragma once
// What Starling's bench binaries share: their command line (initBenchmarks, runBenchmarks), a
// reporter that keeps each benchmark's real time while forwarding to the display reporter, and the
// ratios computed from those times (printed to stderr, written as JSON with --ratios_out=FILE). A
// ratio is time(numerator) / time(denominator) of two benchmarks of the same run; with
// --benchmark_repetitions the median of the repetitions is used. Benchmarks are named by their
// registered name (no /iterations:N or /real_time suffix).
#include <benchmark/benchmark.h>

#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace starling::bench {

// Forwards to the chosen display reporter and keeps each run's real time (ns per iteration).
class Recorder : public benchmark::BenchmarkReporter {
 public:
  explicit Recorder(std::unique_ptr<benchmark::BenchmarkReporter> inner)
      : inner_(std::move(inner)) {}
  bool ReportContext(const Context& c) override { return inner_->ReportContext(c); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      if (r.error_occurred) continue;
      const double t = r.GetAdjustedRealTime() * multiplier(r.time_unit);
      if (r.run_type == Run::RT_Aggregate) {
        if (r.aggregate_name == "median") medians_[r.run_name.function_name] = t;
      } else {
        times_[r.run_name.function_name] = t;
      }
    }
    inner_->ReportRuns(runs);
  }
  void Finalize() override { inner_->Finalize(); }
  // The median of the repetitions when there were any, else the (last) run's time.
  const double* time(const std::string& name) const {
    if (auto m = medians_.find(name); m != medians_.end()) return &m->second;
    if (auto t = times_.find(name); t != times_.end()) return &t->second;
    return nullptr;
  }

 private:
  static double multiplier(benchmark::TimeUnit u) {
    switch (u) {
      case benchmark::kNanosecond:
        return 1;
      case benchmark::kMicrosecond:
        return 1e3;
      case benchmark::kMillisecond:
        return 1e6;
      case benchmark::kSecond:
        return 1e9;
    }
    return 1;
  }
  std::unique_ptr<benchmark::BenchmarkReporter> inner_;
  std::map<std::string, double> times_, medians_;
};

struct Ratio {
  std::string name, numerator, denominator, target;
};

// Prints the ratios whose two benchmarks ran to stderr and, when `out` is not empty, writes them
// as JSON ({"ratios": [{name, value, target, numerator, denominator}, ...]}). False when `out`
// cannot be written.
inline bool reportRatios(const Recorder& rec, const std::vector<Ratio>& ratios,
                         const std::string& out) {
  std::ostringstream js;
  js << "{\n  \"ratios\": [\n";
  bool first = true;
  std::cerr << "\nratios (measured in this run):\n";
  for (const auto& r : ratios) {
    const double *a = rec.time(r.numerator), *b = rec.time(r.denominator);
    if (!a || !b) continue;  // filtered out or not built
    const double v = *a / *b;
    std::cerr << "  " << r.name << " = " << v << "   (target " << r.target << ")\n";
    js << (first ? "" : ",\n") << "    {\"name\": \"" << r.name << "\", \"value\": " << v
       << ", \"target\": \"" << r.target << "\", \"numerator\": \"" << r.numerator
       << "\", \"denominator\": \"" << r.denominator << "\"}";
    first = false;
  }
  js << "\n  ]\n}\n";
  if (out.empty()) return true;
  std::ofstream f(out);
  f << js.str();
  if (!f) {
    std::cerr << "cannot write " << out << "\n";
    return false;
  }
  return true;
}

// What every Starling bench binary takes besides Google Benchmark's own flags.
struct CommandLine {
  bool json = false;       // --benchmark_format=json: the display reporter writes JSON
  std::string ratios_out;  // --ratios_out=FILE
};

// Reads --ratios_out=FILE (taken out) and --benchmark_format=json; `own` sees every other argument
// first and returns true for one of the binary's own flags it consumed. Initializes Google
// Benchmark with the rest. False (after printing why) on an argument nobody knows.
inline bool initBenchmarks(int argc, char** argv, CommandLine& cl,
                           const std::function<bool(const std::string&)>& own = {}) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--benchmark_format=json") cl.json = true;
    if (a.rfind("--ratios_out=", 0) == 0) {
      cl.ratios_out = a.substr(13);
      continue;
    }
    if (i > 0 && own && own(a)) continue;
    args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  return !benchmark::ReportUnrecognizedArguments(n, args.data());
}

// Runs every registered benchmark, displayed on the console or as JSON, and keeps their times.
inline std::unique_ptr<Recorder> runBenchmarks(bool json) {
  std::unique_ptr<benchmark::BenchmarkReporter> display;
  if (json)
    display = std::make_unique<benchmark::JSONReporter>();
  else
    display = std::make_unique<benchmark::ConsoleReporter>();
  auto rec = std::make_unique<Recorder>(std::move(display));
  benchmark::RunSpecifiedBenchmarks(rec.get());
  return rec;
}

}  // namespace starling::bench
