// The strong guarantee under real failures: every allocation compressWithFeedback makes is made to
// fail in turn (a replaced operator new throws std::bad_alloc at the n-th allocation), and after
// each failure the client's state must be byte-for-byte what it was. This reaches the failures
// that argument checks cannot: in the workspace, inside a compressor's encode, while staging new
// state components, and in ClientState::commit. Its own binary, because it replaces operator new.
#include <catch2/catch.hpp>

#include "compression/registry.h"
#include "counting_new.h"
#include "test_util.h"

using namespace starling;
using namespace starling::compression;

namespace {

std::vector<uint8_t> bytesOf(const ClientState& s) {
  std::vector<uint8_t> b;
  s.saveTo(b);
  return b;
}

// Calls compressWithFeedback, failing its n-th allocation for n = 0, 1, ... until a call goes
// through; returns how many failures were injected. `ok` is false if any failure changed the state.
long injectUntilSuccess(const Compressor& c, const ParamLayout& layout,
                        std::span<const float> update, ClientState& st, const RoundContext& ctx,
                        Workspace* ws, bool& ok) {
  for (long n = 0;; ++n) {
    const auto before = bytesOf(st);
    testing::alloc::count = 0;
    testing::alloc::fail_at = n;
    try {
      c.compressWithFeedback(layout, update, st, ctx, ws);
      testing::alloc::fail_at = -1;
      return n;
    } catch (const std::bad_alloc&) {
      testing::alloc::fail_at = -1;
      if (bytesOf(st) != before) ok = false;
    }
  }
}

}  // namespace

TEST_CASE("compressWithFeedback keeps the strong guarantee when any allocation fails",
          "[compression]") {
  const ParamLayout layout = testing::smallCnnLayout();
  std::vector<std::string> specs;
  for (const auto& e : compressors().entries()) specs.push_back(e.name);
  for (const char* extra :
       {"powersgd:mode=local", "powersgd:ef=false", "topk:scope=global", "randblock:ef=false"})
    specs.push_back(extra);
  for (const auto& spec : specs) {
    auto c = makeCompressor(spec);
    const SharedFactors q = c->initialShared(layout, 4);
    for (bool reuse_workspace : {false, true}) {
      ClientState st(layout.fingerprint());
      Workspace ws;
      Workspace* w = reuse_workspace ? &ws : nullptr;
      bool ok = true;
      long injected = 0;
      for (uint64_t round = 1; round <= 2;
           ++round) {  // round 1 creates components, round 2 replaces them
        const auto u = testing::randomVector(layout.numel(), round, 0.1);
        RoundContext ctx{4, round, 0, 1, q.any() ? &q : nullptr};
        injected += injectUntilSuccess(*c, layout, u, st, ctx, w, ok);
        if (c->phases() == 2) {  // phase Q, against some P-hat
          SharedFactors p_hat;
          p_hat.fixed = SharedFactors::Side::kP;
          p_hat.factors.resize(layout.size());
          for (size_t t = 0; t < layout.size(); ++t)
            if (!q.factors[t].empty()) {
              p_hat.factors[t].assign(layout[t].rows() * (q.factors[t].size() / layout[t].cols()),
                                      0.0f);
              for (size_t i = 0; i < p_hat.factors[t].size(); i += 3) p_hat.factors[t][i] = 1.0f;
            }
          RoundContext ctx_q{4, round, 1, 1, &p_hat};
          injected += injectUntilSuccess(*c, layout, {}, st, ctx_q, w, ok);
        }
      }
      INFO(spec << (reuse_workspace ? " with a workspace" : ""));
      CHECK(ok);
      CHECK(injected > 0);  // the calls do allocate, so failures were really injected
    }
  }
}
