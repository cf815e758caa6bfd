// libFuzzer target for the update decoder: any byte string must either decode into an update that
// passed every check or throw DecodeError. Anything else (a crash, a sanitizer report, another
// exception) is a bug. Build: make fuzz (clang, -fsanitize=fuzzer,address,undefined).
#include <cstdint>
#include <cstdlib>

#include "fuzz/fuzz_layout.h"
#include "protocol/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const starling::ParamLayout layout = starling::fuzz::layout();
  static const starling::compression::SharedFactors shared = starling::fuzz::shared();
  try {
    auto u = starling::protocol::decodeUpdate({data, size}, layout, &shared);
    // A decoded update must be safe to aggregate.
    std::vector<float> out(layout.numel());
    starling::compression::densifyUpdate(layout, u.tensors, out, &shared);
  } catch (const starling::protocol::DecodeError&) {
  }
  return 0;
}
