// Writes the seed messages of the fuzzer's corpus into a folder: an update from every scheme's own
// compressor (fuzz_harness.h), a partial aggregate, and a hand-made update of every encoding.
// Usage: starling-fuzz-seeds DIR
#include <cstdio>
#include <fstream>
#include <string>

#include "fuzz/fuzz_harness.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  starling::fuzz::Harness h;
  auto all = starling::fuzz::schemeSeeds(h);
  for (const auto& u : starling::fuzz::seedUpdates())
    all.push_back(starling::protocol::encodeUpdate(u));
  int i = 0;
  for (const auto& bytes : all) {
    const std::string path = std::string(argv[1]) + "/seed-" + std::to_string(i++);
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  std::printf("wrote %d seeds to %s\n", i, argv[1]);
  return 0;
}
