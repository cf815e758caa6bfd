// Writes the valid seed messages of every encoding into a folder: the starting corpus of the
// decoder fuzzer. Usage: starling-fuzz-seeds DIR
#include <cstdio>
#include <fstream>
#include <string>

#include "fuzz/fuzz_layout.h"
#include "protocol/codec.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  int i = 0;
  for (const auto& u : starling::fuzz::seedUpdates()) {
    const auto bytes = starling::protocol::encodeUpdate(u);
    const std::string path = std::string(argv[1]) + "/seed-" + std::to_string(i++);
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  std::printf("wrote %d seeds to %s\n", i, argv[1]);
  return 0;
}
