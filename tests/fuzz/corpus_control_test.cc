// Replays the control-message fuzzer's corpus (tests/fuzz/corpus_control) and the reassembly
// fuzzer's (tests/fuzz/corpus_reassembly) in the normal suite, through the same checks as the
// fuzz targets (control_harness.h, reassembly_harness.h, which abort on a broken property), and
// every single-byte corruption of every control seed and corpus file.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "fuzz/control_harness.h"
#ifdef STARLING_FUZZ_REASSEMBLY_CORPUS
#include "fuzz/reassembly_harness.h"
#endif

using namespace starling;
namespace ctl = starling::fuzz::control;
using K = protocol::MessageKind;

namespace {

// Files of a corpus folder, read into 8-byte aligned storage (as the transport hands them over).
struct Input {
  std::string name;
  std::vector<uint64_t> storage;
  size_t size = 0;
  std::span<const uint8_t> bytes() const {
    return {reinterpret_cast<const uint8_t*>(storage.data()), size};
  }
};

Input aligned(std::string name, std::span<const uint8_t> b) {
  Input in{std::move(name), std::vector<uint64_t>(b.size() / 8 + 1), b.size()};
  if (!b.empty()) std::memcpy(in.storage.data(), b.data(), b.size());
  return in;
}

std::vector<Input> readCorpus(const char* dir) {
  std::vector<Input> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream f(entry.path(), std::ios::binary);
    const std::vector<uint8_t> b((std::istreambuf_iterator<char>(f)),
                                 std::istreambuf_iterator<char>());
    out.push_back(aligned(entry.path().filename().string(), b));
  }
  std::sort(out.begin(), out.end(), [](const Input& a, const Input& b) { return a.name < b.name; });
  return out;
}

// Every single-byte corruption (three flips per byte) goes through the harness, which aborts on a
// broken property. Counts the corruptions tried and those refused (no message decoded).
struct Corruptions {
  size_t tried = 0, refused = 0;
};
void corruptEveryByte(std::span<const uint8_t> good, Corruptions& n) {
  std::vector<uint64_t> storage(good.size() / 8 + 1);
  auto* p = reinterpret_cast<uint8_t*>(storage.data());
  std::memcpy(p, good.data(), good.size());
  const std::span<const uint8_t> b(p, good.size());
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      p[i] ^= flip;
      ++n.tried;
      n.refused += !ctl::checkControl(b).has_value();
      p[i] ^= flip;
    }
  }
}

}  // namespace

TEST_CASE("every control seed decodes as its own kind and holds the harness's properties",
          "[protocol][fuzz]") {
  std::map<K, int> kinds;
  for (const auto& s : ctl::controlSeeds()) {
    INFO("seed " << s.name);
    const Input in = aligned(s.name, s.bytes);
    const auto kind = ctl::checkControl(in.bytes());
    REQUIRE(kind.has_value());
    CHECK(kind == protocol::peekKind(in.bytes()));
    ++kinds[*kind];
  }
  for (K k : {K::kRegister, K::kWelcome, K::kHeartbeat, K::kTask, K::kEvaluation, K::kReject,
              K::kShutdown, K::kChunk, K::kSplitHello, K::kSplitStep, K::kSplitReply,
              K::kSplitBottom, K::kSplitAverage})
    CHECK(kinds[k] >= 1);
}

TEST_CASE("the control fuzz corpus replays cleanly and holds every seed", "[protocol][fuzz]") {
  const auto corpus = readCorpus(STARLING_FUZZ_CONTROL_CORPUS);
  size_t decoded = 0;
  for (const auto& in : corpus) {
    INFO("corpus file " << in.name);
    decoded += ctl::checkControl(in.bytes()).has_value();
  }
  CHECK(corpus.size() < 50);
  // The corpus holds what make_control_seeds writes (regenerate it if an encoding changed).
  for (const auto& s : ctl::controlSeeds()) {
    INFO("seed " << s.name);
    const auto it = std::find_if(corpus.begin(), corpus.end(),
                                 [&](const Input& in) { return in.name == "seed-" + s.name; });
    REQUIRE(it != corpus.end());
    CHECK(std::equal(s.bytes.begin(), s.bytes.end(), it->bytes().begin(), it->bytes().end()));
  }
  CHECK(decoded >= ctl::controlSeeds().size());
}

TEST_CASE("every single-byte corruption of every control seed is refused or holds the properties",
          "[protocol][fuzz]") {
  Corruptions n;
  for (const auto& in : readCorpus(STARLING_FUZZ_CONTROL_CORPUS)) {
    INFO("corpus file " << in.name);
    corruptEveryByte(in.bytes(), n);
  }
  // Every seed's bytes were corrupted, and the decoders noticed some of it (a flipped kind or
  // length byte cannot pass); the rest held the harness's properties.
  CHECK(n.tried >= 3 * ctl::controlSeeds().size());
  CHECK(n.refused > 0);
  CHECK(n.refused < n.tried);
}

#ifdef STARLING_FUZZ_REASSEMBLY_CORPUS
TEST_CASE("the reassembly fuzz corpus replays cleanly", "[transport][fuzz]") {
  namespace ra = starling::fuzz::reassembly;
  size_t completed = 0, refused = 0, ignored = 0, expired = 0;
  for (const auto& s : ra::reassemblySeeds()) {
    INFO("seed " << s.name);
    const auto st = ra::checkReassembly(s.bytes);
    completed += st.completed;
    refused += st.refused;
    ignored += st.ignored;
    expired += st.expired;
  }
  CHECK(completed >= 4);  // both interleaved messages, the single chunk, the budget seed's survivor
  CHECK(refused >= 3);
  CHECK(ignored >= 1);
  CHECK(expired == 1);
  const auto corpus = readCorpus(STARLING_FUZZ_REASSEMBLY_CORPUS);
  CHECK(corpus.size() < 50);
  for (const auto& in : corpus) {
    INFO("corpus file " << in.name);
    ra::checkReassembly(in.bytes());
    // and every single-byte corruption of it
    std::vector<uint8_t> b(in.bytes().begin(), in.bytes().end());
    for (size_t i = 0; i < b.size(); ++i)
      for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
        b[i] ^= flip;
        ra::checkReassembly(b);
        b[i] ^= flip;
      }
  }
  for (const auto& s : ra::reassemblySeeds()) {
    INFO("seed " << s.name);
    CHECK(std::any_of(corpus.begin(), corpus.end(), [&](const Input& in) {
      return in.name == "seed-" + s.name &&
             std::equal(s.bytes.begin(), s.bytes.end(), in.bytes().begin(), in.bytes().end());
    }));
  }
}
#endif
