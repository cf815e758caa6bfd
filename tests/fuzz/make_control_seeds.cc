// Writes the seed corpora of the control-message and reassembly fuzzers: one valid encoding of
// each control message (control_harness.h) into CONTROL_DIR, and the op sequences of the
// reassembly fuzzer (reassembly_harness.h) into REASSEMBLY_DIR.
// Usage: starling-fuzz-control-seeds CONTROL_DIR [REASSEMBLY_DIR]
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz/control_harness.h"
#ifdef STARLING_FUZZ_WITH_TRANSPORT
#include "fuzz/reassembly_harness.h"
#endif

namespace {

bool write(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = dir + "/" + name;
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) std::fprintf(stderr, "cannot write %s\n", path.c_str());
  return static_cast<bool>(f);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s CONTROL_DIR [REASSEMBLY_DIR]\n", argv[0]);
    return 2;
  }
  int n = 0;
  for (const auto& s : starling::fuzz::control::controlSeeds()) {
    if (!write(argv[1], "seed-" + s.name, s.bytes)) return 1;
    ++n;
  }
  std::printf("wrote %d control seeds to %s\n", n, argv[1]);
  if (argc == 3) {
#ifdef STARLING_FUZZ_WITH_TRANSPORT
    n = 0;
    for (const auto& s : starling::fuzz::reassembly::reassemblySeeds()) {
      if (!write(argv[2], "seed-" + s.name, s.bytes)) return 1;
      ++n;
    }
    std::printf("wrote %d reassembly seeds to %s\n", n, argv[2]);
#else
    std::fprintf(stderr, "built without transport/: no reassembly seeds\n");
    return 1;
#endif
  }
  return 0;
}
