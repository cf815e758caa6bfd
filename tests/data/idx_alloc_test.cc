// A hostile IDX header must not make the loader allocate what it claims: the largest single
// allocation is measured with a replaced global operator new (its own binary).
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <new>

#include "core/error.h"
#include "data/idx.h"
#include "data/idx_files.h"

#include "counting_new.h"

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
    const size_t largest = static_cast<size_t>(alloc::largest.load());  // before Catch's macros allocate
    CHECK(threw);
    CHECK(largest < (size_t{1} << 20));
  }
}
