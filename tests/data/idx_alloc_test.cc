// A hostile IDX header must not make the loader allocate what it claims: the largest single
// allocation is measured with a replaced global operator new (its own binary).
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <new>

#include "core/error.h"
#include "counting_new.h"
#include "data/idx.h"
#include "data/idx_files.h"
#include "data/partition.h"

namespace alloc = starling::testing::alloc;

using namespace starling;

TEST_CASE("a header that lies about its size costs no memory", "[data]") {
  testing::TempDir dir;
  std::vector<uint8_t> pixels(100, 1), labels(100, 0);
  // Each header is within the limits (2 GiB of pixels) but the files hold 100 bytes.
  const uint32_t n = 2700000;  // 2.7M images of 28x28: 2.1e9 pixels, 8.5 GB as floats
  testing::writePlain(dir.file("img"), testing::imageFileBytes(n, 28, 28, pixels));
  testing::writeGzip(dir.file("img.gz"), testing::imageFileBytes(n, 28, 28, pixels));
  testing::writePlain(dir.file("lbl"), testing::labelFileBytes(n, labels));
  for (const char* img : {"img", "img.gz"}) {
    INFO(img);
    alloc::largest = 0;
    bool threw = false;
    try {
      data::loadIdx(dir.file(img), dir.file("lbl"));
    } catch (const IoError&) {
      threw = true;
    }
    const size_t largest =
        static_cast<size_t>(alloc::largest.load());  // before Catch's macros allocate
    CHECK(threw);
    CHECK(largest < (size_t{1} << 20));
  }
}

TEST_CASE("a subset costs memory for the examples it keeps, not for the whole file", "[data]") {
  // A deployed client once loaded all of Fashion-MNIST as floats (188 MB) to keep a tenth.
  testing::TempDir dir;
  const uint32_t n = 20000;  // 20,000 images of 28x28: 62.7 MB as floats
  std::vector<uint8_t> pixels(size_t{n} * 784), labels(n);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<uint8_t>(i % 10);
  testing::writeGzip(dir.file("img.gz"), testing::imageFileBytes(n, 28, 28, pixels));
  testing::writePlain(dir.file("lbl"), testing::labelFileBytes(n, labels));
  alloc::largest = 0;
  alloc::bytes = 0;
  const data::Dataset d =
      data::loadIdxSubset(dir.file("img.gz"), dir.file("lbl"), [](const auto& l, uint32_t) {
        std::vector<size_t> every_tenth;
        for (size_t i = 0; i < l.size(); i += 10) every_tenth.push_back(i);
        return every_tenth;
      });
  const long largest = alloc::largest.load(), bytes = alloc::bytes.load();
  REQUIRE(d.size() == n / 10);
  const long kept = static_cast<long>(d.images.size() * sizeof(float));  // 6.3 MB
  CHECK(largest <= kept);  // no allocation larger than the kept images
  CHECK(bytes <
        2 * kept + (4L << 20));  // all allocations together: the kept images, labels, buffers
  CHECK(bytes <
        static_cast<long>(size_t{n} * 784 * sizeof(float)) / 4);  // far below the whole file
}

TEST_CASE("a pool of ten million drawn clients holds nothing per client", "[data]") {
  std::vector<uint8_t> labels(1000);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<uint8_t>(i % 10);
  const std::shared_ptr<const data::Partitioner> rule = data::makePartitioner("sampled:size=60");
  alloc::bytes = 0;
  const data::ClientShards pool = data::ClientShards::make(rule, labels, 10, 10'000'000, 3);
  const long made = alloc::bytes.load();
  std::vector<size_t> scratch;
  for (uint64_t k : {uint64_t{0}, uint64_t{4'999'999}, uint64_t{9'999'999}}) pool.shard(k, scratch);
  const long drawn = alloc::bytes.load() - made;  // before Catch's macros allocate
  CHECK(pool.size() == 10'000'000);
  CHECK(made < 1024);              // held, the shards would be 10^7 x 60 x 8 bytes
  CHECK(drawn <= 4 * 60 * 8 * 2);  // the scratch shard, grown at most a few times
}
