// The one frame of Starling's own files (core/framed_file.h): what is written reads back; a cut,
// grown, damaged, foreign or out-of-range file is refused saying so; a format's versions from
// before the frame still read.
#include "core/framed_file.h"

#include <catch2/catch.hpp>

#include "core/bytes.h"
#include "core/error.h"
#include "core/file_io.h"
#include "temp_dir.h"

using namespace starling;
using Catch::Matchers::Contains;

namespace {

constexpr FileFormat kFormat{0x54534554 /* "TEST" */, "test file", 2, 4, 5};

std::vector<uint8_t> payloadOf(size_t n) {
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(i * 37 + 11);
  return p;
}

std::string refusal(std::span<const uint8_t> bytes) {
  try {
    unframe(kFormat, bytes, "f");
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a framed file reads back its version and payload", "[core][framed]") {
  for (size_t n : {0, 1, 31, 32, 33, 1000}) {
    const auto payload = payloadOf(n);
    const auto bytes = framed(kFormat, payload);
    REQUIRE(bytes.size() == 24 + n);
    const Unframed u = unframe(kFormat, bytes, "f");
    CHECK(u.version == kFormat.current);
    CHECK(u.framed);
    CHECK(std::vector<uint8_t>(u.payload.begin(), u.payload.end()) == payload);
    CHECK(hasMagic(bytes, kFormat.magic));
    CHECK_FALSE(hasMagic(bytes, kFormat.magic + 1));
  }
  testing::TempDir dir("framed");
  const auto path = dir.path / "x.bin";
  writeFramed(path, kFormat, payloadOf(77));
  const auto file = readFile(path, 1 << 20);
  CHECK(file == framed(kFormat, payloadOf(77)));
}

TEST_CASE("every cut, every grown end and every flipped bit of a framed file is refused",
          "[core][framed]") {
  const auto bytes = framed(kFormat, payloadOf(70));
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("cut to " << n << " bytes");
    CHECK_FALSE(refusal(std::span(bytes).first(n)).empty());
  }
  auto grown = bytes;
  grown.push_back(0);
  CHECK_THAT(refusal(grown), Contains("trailing bytes"));
  CHECK_THAT(refusal(std::span(bytes).first(bytes.size() - 1)), Contains("truncated"));
  size_t refused = 0, bits = 0;
  for (size_t i = 0; i < bytes.size(); ++i)
    for (int b = 0; b < 8; ++b) {
      auto bad = bytes;
      bad[i] ^= static_cast<uint8_t>(1u << b);
      ++bits;
      const std::string why = refusal(bad);
      // A flip in the version may name another version this format reads (none here: 5 flips to
      // 4, 7, 1, 13, ...; 4 is framed too, so its payload must still pass the checksum).
      if (i >= 4 && i < 8 && bad[4] == 4 && bad[5] == 0 && bad[6] == 0 && bad[7] == 0) {
        CHECK(why.empty());
        continue;
      }
      CHECK_FALSE(why.empty());
      refused += !why.empty();
      if (i >= 24) CHECK_THAT(why, Contains("damaged"));
      if (i < 4) CHECK_THAT(why, Contains("not a test file"));
    }
  CHECK(refused == bits - 1);  // all but the flip of 5 to 4
}

TEST_CASE(
    "a format's versions: older unframed ones read, out-of-range ones refused with what to do",
    "[core][framed]") {
  const auto payload = payloadOf(40);
  const auto versioned = [&](uint32_t v) {
    std::vector<uint8_t> b;
    ByteWriter w(b);
    w.u32(kFormat.magic);
    w.u32(v);
    w.bytes(payload.data(), payload.size());
    return b;
  };
  for (uint32_t v : {2u, 3u}) {  // before the frame: the payload follows the version
    const auto old = versioned(v);
    const Unframed u = unframe(kFormat, old, "f");
    CHECK(u.version == v);
    CHECK_FALSE(u.framed);
    CHECK(std::vector<uint8_t>(u.payload.begin(), u.payload.end()) == payload);
  }
  CHECK_THAT(refusal(versioned(1)), Contains("older than this build reads (2 to 5)"));
  CHECK_THAT(refusal(versioned(6)),
             Contains("newer than this build reads") && Contains("use the build that wrote it"));
  // Version 4 is framed: without its length and checksum it is refused.
  CHECK_FALSE(refusal(versioned(4)).empty());
}

TEST_CASE("the frame's checksum follows every bit and the length, wherever the bytes lie",
          "[core][framed]") {
  const auto p = payloadOf(100);
  const uint64_t sum = frameChecksum(p);
  // The same at any alignment.
  for (size_t offset = 1; offset < 8; ++offset) {
    std::vector<uint8_t> shifted(offset + p.size());
    std::copy(p.begin(), p.end(), shifted.begin() + static_cast<std::ptrdiff_t>(offset));
    CHECK(frameChecksum(std::span(shifted).subspan(offset)) == sum);
  }
  for (size_t i = 0; i < p.size(); ++i)
    for (int b = 0; b < 8; ++b) {
      auto q = p;
      q[i] ^= static_cast<uint8_t>(1u << b);
      CHECK(frameChecksum(q) != sum);
    }
  // Two flips of one bit position in words of one lane (32 bytes apart: a float's sign bit twice)
  // do not cancel; nor does any pair of flips in two words.
  const auto q0 = payloadOf(128);
  const uint64_t s0 = frameChecksum(q0);
  size_t pairs = 0, same = 0;
  for (size_t w1 = 0; w1 < 16; ++w1)
    for (size_t w2 = w1 + 1; w2 < 16; ++w2)
      for (int bit = 0; bit < 64; bit += (w2 - w1) % 4 == 0 ? 1 : 7) {
        auto q = q0;
        q[8 * w1 + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        q[8 * w2 + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
        ++pairs;
        same += frameChecksum(q) == s0;
      }
  CHECK(pairs > 1000);
  CHECK(same == 0);
  // Zeros appended change it (the length is in it), and so does a block's lanes swapped.
  std::vector<uint8_t> zeros(64, 0), more(65, 0);
  CHECK(frameChecksum(zeros) != frameChecksum(more));
  CHECK(frameChecksum(std::span(zeros).first(0)) != frameChecksum(std::span(zeros).first(8)));
  auto swapped = p;
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  CHECK(frameChecksum(swapped) != sum);
}
