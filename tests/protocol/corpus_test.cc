// Replays the decoder fuzzer's corpus (tests/fuzz/corpus) in the normal suite: every input must
// decode into a checked update or throw DecodeError, nothing else.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz/fuzz_layout.h"
#include "protocol/codec.h"

using namespace starling;

TEST_CASE("the fuzz corpus replays cleanly", "[protocol]") {
  const ParamLayout layout = fuzz::layout();
  const compression::SharedFactors shared = fuzz::shared();
  size_t files = 0, accepted = 0;
  for (const auto& entry : std::filesystem::directory_iterator(STARLING_FUZZ_CORPUS)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream f(entry.path(), std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ++files;
    INFO(entry.path().string());
    try {
      auto u = protocol::decodeUpdate(bytes, layout, &shared);
      std::vector<float> out(layout.numel());
      compression::densifyUpdate(layout, u.tensors, out, &shared);
      ++accepted;
    } catch (const protocol::DecodeError&) {
    }
  }
  CHECK(files >= 9);     // at least the seeds of every encoding
  CHECK(accepted >= 9);  // and the seeds decode
}
