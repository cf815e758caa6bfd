#pragma once
// Helpers of the LibTorch benchmarks. The image data: the first n examples of Fashion-MNIST's
// training split when the Debian package is installed, n random 28x28 images with random labels (10
// classes) otherwise; which one is said on stderr.
#include <benchmark/benchmark.h>

#include <chrono>
#include <iostream>
#include <utility>

#include "core/rng.h"
#include "data/idx.h"

namespace starling::bench {

inline data::Dataset fashionOrRandom(size_t n) {
  data::Dataset d;
  try {
    d = data::loadFashionMnist(data::kDefaultFashionMnistDir, "train");
    d.images.resize(n * d.features());
    d.labels.resize(n);
    std::cerr << "data: the first " << n << " examples of Fashion-MNIST (train)\n";
    return d;
  } catch (const std::exception& e) {
    std::cerr << "data: random 28x28 images (" << e.what() << ")\n";
  }
  RngStream r(StreamKey{1, 0, 0, StreamPurpose::kTest, 0});
  d.rows = d.cols = 28;
  d.num_classes = 10;
  for (size_t i = 0; i < n * 784; ++i) d.images.push_back(r.uniformFloat());
  for (size_t i = 0; i < n; ++i) d.labels.push_back(static_cast<uint8_t>(r.below(10)));
  return d;
}

// initBenchmarks' extra-flag parser for --threads=N (LibTorch threads).
inline auto threadsFlag(int& threads) {
  return [&threads](const std::string& a) {
    if (a.rfind("--threads=", 0) != 0) return false;
    threads = std::stoi(a.substr(10));
    return true;
  };
}

// Runs `a` then `b` once per benchmark iteration, each timed on its own (wall time): slow changes
// of a shared machine's load hit both alike. Returns their total seconds.
template <class A, class B>
std::pair<double, double> pairedSeconds(benchmark::State& st, A&& a, B&& b) {
  using Steady = std::chrono::steady_clock;  // not the injectable starling::Clock
  double as = 0, bs = 0;
  for (auto _ : st) {
    const auto t0 = Steady::now();
    a();
    const auto t1 = Steady::now();
    b();
    const auto t2 = Steady::now();
    as += std::chrono::duration<double>(t1 - t0).count();
    bs += std::chrono::duration<double>(t2 - t1).count();
  }
  return {as, bs};
}

}  // namespace starling::bench
