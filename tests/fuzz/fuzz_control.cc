// libFuzzer target for the deployment's control messages (protocol/control.h), which clients,
// aggregators and the server decode from peers they do not trust: peekKind, then the decoder of
// the kind it names (a Task against fuzz::layout() and the softmax 784x10 layout), and the
// properties control_harness.h lists (routing agrees with decoding, fields within their documented
// bounds, a task's model finite and applicable with applyModel, a chunk's data inside the input,
// memory linear in the input, stable encode/decode round trips). Seeds: tests/fuzz/corpus_control.
// Build and run: make fuzz-control (clang, ASan + UBSan, -rss_limit_mb and -malloc_limit_mb).
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz/control_harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The transport hands decoders 8-byte aligned bytes (it realigns others); libFuzzer's buffer is
  // a fresh allocation, so this is aligned too, but say so.
  std::vector<uint64_t> aligned(size / 8 + 1);
  if (size) std::memcpy(aligned.data(), data, size);
  starling::fuzz::control::checkControl({reinterpret_cast<const uint8_t*>(aligned.data()), size});
  return 0;
}
