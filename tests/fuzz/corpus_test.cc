// Replays the fuzzer's corpus (tests/fuzz/corpus) and the structure-aware seeds in the normal
// suite, through the same harness as the fuzz target: every input is accepted by some scheme
// with a finite aggregate, or refused with an InputError; the harness aborts on anything else.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz/fuzz_harness.h"

using namespace starling;

TEST_CASE("the fuzz corpus replays cleanly through the server path", "[protocol][fuzz]") {
  fuzz::Harness h;
  size_t files = 0, accepted = 0;
  for (const auto& entry : std::filesystem::directory_iterator(STARLING_FUZZ_CORPUS)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream f(entry.path(), std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
    ++files;
    accepted += fuzz::checkInput(h, bytes) > 0;
  }
  CHECK(files >= 9);
  CHECK(accepted >= 1);
}

TEST_CASE("every scheme's own seed is accepted by its scheme", "[protocol][fuzz]") {
  fuzz::Harness h;
  const auto seeds = fuzz::schemeSeeds(h);
  REQUIRE(seeds.size() == fuzz::schemeSpecs().size() + 2);  // + a partial, + a phase-Q update
  for (const auto& s : seeds) {
    INFO("seed of " << s.size() << " bytes");
    CHECK(fuzz::checkInput(h, s) >= 1);
  }
  // A hand-made seed the round cannot accept still decodes: it is rejected by the round only.
  CHECK(fuzz::checkInput(h, protocol::encodeUpdate(fuzz::seedUpdates()[4])) == 0);
}
