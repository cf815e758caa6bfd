#include "core/param_layout.h"

#include <catch2/catch.hpp>

#include "core/error.h"

using namespace starling;

TEST_CASE("layout assigns contiguous offsets in order", "[core]") {
  ParamLayout l;
  CHECK(l.add("a", {3, 4}) == 0);
  CHECK(l.add("b", {5}) == 1);
  CHECK(l.add("s", {}) == 2);
  CHECK(l.numel() == 12 + 5 + 1);
  CHECK(l[0].offset == 0);
  CHECK(l[1].offset == 12);
  CHECK(l[2].offset == 17);
  CHECK(l[0].rows() == 3);
  CHECK(l[0].cols() == 4);
  CHECK(l[1].rows() == 5);
  CHECK(l[1].cols() == 1);
  CHECK(l[2].numel == 1);
  CHECK(l.find("b") == 1u);
  CHECK_FALSE(l.find("zz").has_value());
}

TEST_CASE("layout maps views over the flat buffer", "[core]") {
  ParamLayout l;
  l.add("w", {2, 3});
  l.add("b", {2});
  std::vector<float> buf(8);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  auto m = l.matrix(std::span<float>(buf), 0);
  CHECK(m(1, 2) == 5.0f);  // row-major
  auto b = l.slice(std::span<float>(buf), 1);
  CHECK(b[0] == 6.0f);
  b[1] = 42.0f;
  CHECK(buf[7] == 42.0f);
  std::vector<float> wrong(7);
  CHECK_THROWS_AS(l.slice(std::span<float>(wrong), 0), InvalidArgument);
  CHECK_THROWS_AS(l.tensor(2), InvalidArgument);
}

TEST_CASE("layout rejects bad tensors with clear errors", "[core]") {
  ParamLayout l;
  l.add("a", {2});
  CHECK_THROWS_WITH(l.add("a", {3}), Catch::Contains("duplicate tensor name 'a'"));
  CHECK_THROWS_WITH(l.add("", {3}), Catch::Contains("empty name"));
  CHECK_THROWS_WITH(l.add("z", {3, 0}), Catch::Contains("non-positive dimension"));
  CHECK_THROWS_WITH(l.add("n", {-1}), Catch::Contains("non-positive dimension"));
  CHECK_THROWS_WITH(l.add("big", {1 << 20, 1 << 20}), Catch::Contains("more than"));
  CHECK(l.size() == 1);  // nothing half-added
}

TEST_CASE("fingerprint depends on names and shapes and order only", "[core]") {
  auto make = [](std::vector<std::pair<std::string, std::vector<int64_t>>> ts) {
    ParamLayout l;
    for (auto& [n, s] : ts) l.add(n, s);
    return l.fingerprint();
  };
  const auto base = make({{"w", {4, 3}}, {"b", {4}}});
  CHECK(base == make({{"w", {4, 3}}, {"b", {4}}}));
  CHECK(base != make({{"w", {3, 4}}, {"b", {4}}}));  // same numel, other shape
  CHECK(base != make({{"w", {12}}, {"b", {4}}}));    // same numel, other rank
  CHECK(base != make({{"b", {4}}, {"w", {4, 3}}}));  // order
  CHECK(base != make({{"W", {4, 3}}, {"b", {4}}}));  // name
  CHECK(base != make({{"w", {4, 3}}}));              // prefix
  CHECK(make({{"ab", {1}}, {"c", {1}}}) != make({{"a", {1}}, {"bc", {1}}}));  // name boundaries
  CHECK(make({}) != base);
}

// Golden fingerprints: a silent change of the hash (or of what it covers) fails here. The values
// were computed by an independent implementation (a Python script written for this purpose, not
// part of the repository) of 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3)
// over the records docs/update-model.md documents: per tensor, u64 little-endian name length, the
// name's bytes, u64 little-endian rank, each dimension as u64 little-endian.
TEST_CASE("layout fingerprints match independently computed golden values", "[core]") {
  ParamLayout cnn;  // tests/test_util.h's smallCnnLayout(), spelled out so that this test owns it
  cnn.add("conv1.weight", {16, 1, 5, 5});
  cnn.add("conv1.bias", {16});
  cnn.add("fc1.weight", {64, 256});
  cnn.add("fc1.bias", {64});
  cnn.add("fc2.weight", {10, 64});
  cnn.add("fc2.bias", {10});
  CHECK(cnn.fingerprint() == 0x04d9cf73bb16122dull);

  ParamLayout one;
  one.add("w", {3, 4});
  CHECK(one.fingerprint() == 0x2a3da6ce7bc4c56cull);

  ParamLayout scalar;
  scalar.add("s", {});
  CHECK(scalar.fingerprint() == 0x5d520aabfffe66f5ull);

  ParamLayout fuzz;  // tests/fuzz/fuzz_layout.h's model
  fuzz.add("w", {8, 12});
  fuzz.add("b", {8});
  CHECK(fuzz.fingerprint() == 0x916a1118591efa2dull);

  CHECK(ParamLayout().fingerprint() == 0xcbf29ce484222325ull);  // the empty layout: the basis

  // docs/protocol.md's worked example and the deployed models' layouts, which a client written in
  // another language checks its own implementation against (values from the same independent
  // implementation, the Python function docs/protocol.md prints).
  ParamLayout worked;
  worked.add("w", {2, 3});
  CHECK(worked.fingerprint() == 0x1c4b677b6e0bff4aull);  // after the first record
  worked.add("b", {2});
  CHECK(worked.fingerprint() == 0xd9a5f084920a75c8ull);
  ParamLayout softmax;
  softmax.add("fc.weight", {10, 784});
  softmax.add("fc.bias", {10});
  CHECK(softmax.fingerprint() == 0x041c75f26c40b566ull);
  ParamLayout mlp;
  mlp.add("fc1.weight", {128, 784});
  mlp.add("fc1.bias", {128});
  mlp.add("fc2.weight", {10, 128});
  mlp.add("fc2.bias", {10});
  CHECK(mlp.fingerprint() == 0x5340aa0c80dc3ae4ull);
}
