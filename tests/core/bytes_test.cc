#include "core/bytes.h"

#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using namespace starling;

namespace {

std::vector<uint8_t> written(const std::function<void(ByteWriter&)>& f) {
  std::vector<uint8_t> out;
  ByteWriter w(out);
  f(w);
  return out;
}

}  // namespace

TEST_CASE("every type round-trips through ByteWriter and ByteReader", "[core]") {
  const float nan_payload = std::bit_cast<float>(0x7fc01234u);
  const std::vector<float> floats = {0.0f,
                                     -0.0f,
                                     1.5f,
                                     -3.25e-30f,
                                     std::numeric_limits<float>::max(),
                                     std::numeric_limits<float>::denorm_min(),
                                     nan_payload,
                                     std::numeric_limits<float>::infinity()};
  const uint8_t raw[] = {9, 8, 7};
  const auto bytes = written([&](ByteWriter& w) {
    w.u8(0);
    w.u8(255);
    w.u32(0);
    w.u32(0xdeadbeefu);
    w.u64(0x0123456789abcdefull);
    w.u64(~0ull);
    w.f32(-0.0f);
    w.f32(nan_payload);
    w.f64(-1.0 / 3.0);
    w.f64(std::numeric_limits<double>::lowest());
    w.str("");
    w.str("component.name");
    w.floats(floats);
    w.floats({});
    w.bytes(raw, 3);
    w.bytes(nullptr, 0);
  });
  CHECK(bytes.size() == 2 + 8 + 16 + 8 + 16 + 4 + 4 + 14 + 8 + 4 * floats.size() + 8 + 3);
  ByteReader r(bytes, "blob");
  CHECK(r.u8() == 0);
  CHECK(r.u8() == 255);
  CHECK(r.u32() == 0u);
  CHECK(r.u32() == 0xdeadbeefu);
  CHECK(r.u64() == 0x0123456789abcdefull);
  CHECK(r.u64() == ~0ull);
  CHECK(std::bit_cast<uint32_t>(r.f32()) == 0x80000000u);
  CHECK(std::bit_cast<uint32_t>(r.f32()) == 0x7fc01234u);  // NaN payload kept
  CHECK(r.f64() == -1.0 / 3.0);
  CHECK(r.f64() == std::numeric_limits<double>::lowest());
  CHECK(r.str(0) == "");
  CHECK(r.str(14) == "component.name");
  std::vector<float> back = {42.0f};  // replaced, not appended to
  r.floats(back);
  REQUIRE(back.size() == floats.size());
  for (size_t i = 0; i < floats.size(); ++i)
    CHECK(std::bit_cast<uint32_t>(back[i]) == std::bit_cast<uint32_t>(floats[i]));
  r.floats(back);
  CHECK(back.empty());
  CHECK_FALSE(r.done());
  const auto v = r.view(3);
  CHECK(std::vector<uint8_t>(v.begin(), v.end()) == std::vector<uint8_t>{9, 8, 7});
  CHECK(v.data() == bytes.data() + bytes.size() - 3);  // a view, not a copy
  CHECK(r.done());
  CHECK(r.remaining() == 0u);
  CHECK(r.position() == bytes.size());
  CHECK_NOTHROW(r.finish());
}

TEST_CASE("the byte layout is little-endian whatever the host", "[core]") {
  using V = std::vector<uint8_t>;
  CHECK(written([](ByteWriter& w) { w.u32(0x01020304u); }) == V{0x04, 0x03, 0x02, 0x01});
  CHECK(written([](ByteWriter& w) { w.u64(0x0102030405060708ull); }) == V{8, 7, 6, 5, 4, 3, 2, 1});
  CHECK(written([](ByteWriter& w) { w.f32(1.0f); }) == V{0x00, 0x00, 0x80, 0x3f});
  CHECK(written([](ByteWriter& w) { w.f64(-2.0); }) == V{0, 0, 0, 0, 0, 0, 0x00, 0xc0});
  CHECK(written([](ByteWriter& w) { w.str("ab"); }) == V{2, 0, 0, 0, 'a', 'b'});
  CHECK(written([](ByteWriter& w) {
          w.floats(std::vector<float>{1.0f, -2.0f});
        }) == V{2, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0});
  // And the reader reads those bytes back the same way.
  const V le = {0x04, 0x03, 0x02, 0x01, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
  ByteReader r(le, "le");
  CHECK(r.u32() == 0x01020304u);
  CHECK(r.u64() == 0x0102030405060708ull);
}

TEST_CASE("the writer appends to the caller's vector and patches lengths", "[core]") {
  std::vector<uint8_t> out = {0xaa};
  out.reserve(64);
  const uint8_t* data = out.data();
  ByteWriter w(out);
  w.u64(0);
  w.u32(7);
  w.patchU64(1, 0x1122334455667788ull);
  CHECK(w.size() == 13u);
  CHECK(out ==
        std::vector<uint8_t>{0xaa, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, 7, 0, 0, 0});
  CHECK(out.data() == data);                         // within capacity: no reallocation
  CHECK_THROWS_AS(w.patchU64(6, 1), InternalError);  // 6 + 8 > 13
}

TEST_CASE("every out-of-bounds read is an IoError naming the field and the offset", "[core]") {
  const std::vector<uint8_t> b = {1, 2, 3, 4, 5, 6, 7};
  struct Read {
    const char* name;
    size_t size;  // bytes the read needs
    std::function<void(ByteReader&)> read;
  };
  const std::vector<Read> reads = {
      {"u8", 1, [](ByteReader& r) { r.u8(); }},
      {"u32", 4, [](ByteReader& r) { r.u32(); }},
      {"u64", 8, [](ByteReader& r) { r.u64(); }},
      {"f32", 4, [](ByteReader& r) { r.f32(); }},
      {"f64", 8, [](ByteReader& r) { r.f64(); }},
      {"view", 8, [](ByteReader& r) { r.view(8); }},
      {"floats", 8,
       [](ByteReader& r) {
         std::vector<float> v;
         r.floats(v);
       }},  // its u64 count alone
      // A string's u32 length fits from offsets 0..3, and then claims millions of bytes.
      {"str", 4, [](ByteReader& r) { r.str(std::numeric_limits<size_t>::max()); }},
  };
  for (size_t start = 0; start <= b.size(); ++start) {
    for (const auto& rd : reads) {
      INFO(rd.name << " after " << start << " bytes");
      ByteReader r(b, "optimizer state");
      r.view(start);
      const size_t left = b.size() - start;
      if (rd.size <= left && std::string(rd.name) != "str") {
        CHECK_NOTHROW(rd.read(r));
        continue;
      }
      // The offset is where the field starts, or for a string whose length fits, where its bytes
      // do.
      const size_t at = rd.size <= left ? start + 4 : start;
      CHECK_THROWS_AS(rd.read(r), IoError);
      ByteReader again(b, "optimizer state");
      again.view(start);
      CHECK_THROWS_WITH(rd.read(again),
                        Catch::StartsWith("optimizer state: ") &&
                            Catch::Contains("(at byte " + std::to_string(at) + " of 7)"));
    }
  }
}

TEST_CASE("counts that lie are refused before anything is allocated", "[core]") {
  SECTION("floats") {
    for (uint64_t count : {uint64_t{3}, uint64_t{1} << 40, uint64_t{1} << 62, ~uint64_t{0}}) {
      std::vector<uint8_t> b;
      ByteWriter w(b);
      w.u64(count);
      w.f32(1.0f);
      w.f32(2.0f);  // 8 bytes of data: room for 2 floats
      ByteReader r(b, "residual");
      std::vector<float> out;  // no capacity: any allocation would show
      INFO("count " << count);
      CHECK_THROWS_WITH(r.floats(out), Catch::Contains("residual") && Catch::Contains("claims") &&
                                           Catch::Contains("(at byte 8 of 16)"));
      CHECK(out.capacity() == 0u);
      std::vector<float> kept = {7.0f, 8.0f};
      ByteReader r2(b, "residual");
      CHECK_THROWS_AS(r2.floats(kept), IoError);
      CHECK(kept == std::vector<float>{7.0f, 8.0f});  // untouched
    }
  }
  SECTION("strings") {
    std::vector<uint8_t> b;
    ByteWriter w(b);
    w.u32(60);
    w.bytes("abc", 3);
    ByteReader r(b, "name");
    CHECK_THROWS_WITH(r.str(64), Catch::Contains("truncated"));
    ByteReader r2(b, "name");
    CHECK_THROWS_WITH(r2.str(59), Catch::Contains("exceeds the limit of 59"));
  }
}

TEST_CASE("finish() refuses trailing bytes", "[core]") {
  const std::vector<uint8_t> b = {1, 0, 0, 0, 9};
  ByteReader r(b, "blob");
  CHECK(r.u32() == 1u);
  CHECK_THROWS_WITH(r.finish(), Catch::Contains("blob") && Catch::Contains("1 trailing bytes") &&
                                    Catch::Contains("(at byte 4 of 5)"));
  CHECK(r.u8() == 9);
  CHECK_NOTHROW(r.finish());
}
