// libFuzzer target for the transport's reassembly of chunked messages (transport/reassembly.h):
// the input is a budget and a sequence of chunk operations by four peers (reassembly_harness.h);
// the reassembler must stay within its budget, account exactly for the bytes that arrived, and
// complete only messages equal to the chunk data that built them. Seeds:
// tests/fuzz/corpus_reassembly. Build and run: make fuzz-reassembly.
#include <cstdint>

#include "fuzz/reassembly_harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  starling::fuzz::reassembly::checkReassembly({data, size});
  return 0;
}
