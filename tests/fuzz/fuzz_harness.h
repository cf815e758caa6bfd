#pragma once
// What the decoder fuzzer checks for every input, shared by the libFuzzer target
// (fuzz_decode.cc) and the corpus replay in the normal suite (corpus_test.cc).
//
// An input is decoded (protocol::Decoder). If it is an Update, it is offered to the first phase of
// a round of every scheme below, as a server would; if it is a PartialAggregate, it is merged into
// a FedAvg round as a root would. Whatever is accepted must leave the aggregate finite, even
// weighted by the largest claim the bounds allow, and the round must still finish with a finite
// delta and finite next shared factors. Anything else than acceptance or an InputError (a crash, a
// sanitizer report, another exception, a non-finite aggregate) is a bug: checkInput() aborts.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "aggregation/round_scheme.h"
#include "core/finite.h"
#include "fuzz/fuzz_layout.h"
#include "protocol/codec.h"

namespace starling::fuzz {

inline constexpr uint64_t kRound = 3;

// One scheme per encoding family, with options matching fuzz::layout().
inline const std::vector<std::string>& schemeSpecs() {
  static const std::vector<std::string> kSpecs = {"none",
                                                  "fp16",
                                                  "bf16",
                                                  "topk:density=0.1",
                                                  "stc:density=0.1",
                                                  "randk:density=0.1",
                                                  "randblock:density=0.1",
                                                  "sign",
                                                  "qsgd:levels=3",
                                                  "powersgd:rank=2,min_rate=1",
                                                  "powersgd:rank=2,min_rate=1,mode=local",
                                                  "acpsgd:rank=2,min_rate=1"};
  return kSpecs;
}

struct Harness {
  std::shared_ptr<const ParamLayout> layout = std::make_shared<const ParamLayout>(fuzz::layout());
  std::vector<std::unique_ptr<aggregation::RoundScheme>> schemes;
  protocol::Decoder decoder{*layout};
  Harness() {
    for (const auto& spec : schemeSpecs()) {
      aggregation::RoundSchemeOptions o;
      o.compressor = spec;
      o.run_seed = 1;
      o.metrics = {"loss"};
      schemes.push_back(std::make_unique<aggregation::RoundScheme>(layout, o));
    }
  }
};

[[noreturn]] inline void bug(const char* what) {
  std::fprintf(stderr, "fuzz harness: %s\n", what);
  std::abort();
}

inline void requireFinite(std::span<const float> v, const char* what) {
  if (!allFinite(v)) bug(what);
}

// An honest client that takes part in rounds opened after the fuzzer's input was accepted.
struct HonestClient {
  uint64_t id;
  ClientState state;
  compression::Update next(const aggregation::RoundScheme& scheme,
                           const compression::PhaseBroadcast& b) {
    const ParamLayout& l = scheme.layout();
    std::vector<float> update;
    if (b.phase == 0) {
      update.resize(l.numel());
      for (size_t i = 0; i < update.size(); ++i)
        update[i] = 0.01f * static_cast<float>(static_cast<int>(i % 7) - 3);
    }
    compression::Update u;
    u.header = {l.fingerprint(), b.round, b.phase, id, 60};
    u.tensors = scheme.compressor().compressWithFeedback(l, update, state, b.context(id));
    return u;
  }
};

// After an accepted input in `round`: an honest client still gets into every remaining phase of
// this round and every phase of the next one, every aggregate stays finite, and both rounds
// finish with a finite delta and finite shared factors. (A refused honest update or a round that
// cannot finish is a denial of service: the harness aborts on it like on a non-finite value.)
// `honest` has taken part in the phases before the current one.
inline void honestRoundsStillWork(const aggregation::RoundScheme& scheme,
                                  std::unique_ptr<aggregation::Round> round, HonestClient honest) {
  for (int r = 0; r < 2; ++r) {
    for (;;) {
      try {
        round->current().add(compression::view(honest.next(scheme, round->broadcast())));
      } catch (const InputError&) {
        bug("an honest client was refused after an accepted input");
      }
      requireFinite(round->current().partial().buffer(),
                    "an accepted input made the aggregate non-finite");
      if (round->lastPhase()) break;
      round->nextPhase();
      if (round->broadcast().shared)
        for (const auto& f : round->broadcast().shared->factors)
          requireFinite(f, "non-finite P-hat");
    }
    aggregation::RoundResult res;
    try {
      res = round->finish();
    } catch (const InvalidArgument&) {
      bug("a round with an accepted input could not finish");
    }
    requireFinite(res.delta, "an accepted input gave a non-finite delta");
    for (const auto& f : res.next.shared.factors)
      requireFinite(f, "non-finite next shared factors");
    if (r == 0) round = scheme.begin(round->number() + 1, res.next);
  }
}

// Returns how many schemes accepted the input (0 = rejected everywhere).
inline int checkInput(Harness& h, std::span<const uint8_t> bytes) {
  int accepted = 0;
  try {
    const compression::UpdateView& u = h.decoder.decodeUpdate(bytes);
    const uint64_t id = u.header.client_id, twin = id ^ 1,
                   honest_id = twin + 2;  // three distinct ids
    for (const auto& scheme : h.schemes) {
      // The input is offered at the phase it names (phase Q of a two-phase scheme included): the
      // phases before it are played by honest clients under its id, its twin's and the honest
      // one's.
      if (u.header.phase >= scheme->phases()) continue;
      auto round = scheme->begin(kRound, scheme->initialCarry());
      HonestClient honest{honest_id, ClientState(scheme->layout().fingerprint())};
      HonestClient self{id, ClientState(scheme->layout().fingerprint())};
      HonestClient other{twin, ClientState(scheme->layout().fingerprint())};
      while (round->phase() < u.header.phase) {
        for (HonestClient* c : {&honest, &self, &other})
          round->current().add(compression::view(c->next(*scheme, round->broadcast())));
        round->nextPhase();
      }
      try {
        round->current().add(u);
      } catch (const InputError&) {
        continue;
      }
      ++accepted;
      // The largest weight the bounds allow, added once more on top: still finite.
      compression::UpdateView heavy = u;
      heavy.header.client_id = twin;
      heavy.header.num_examples = scheme->options().bounds.max_examples;
      try {
        round->current().add(heavy);
      } catch (const InputError&) {
        bug("an update accepted once was refused with another weight and client id");
      }
      honestRoundsStillWork(*scheme, std::move(round), std::move(honest));
    }
    return accepted;
  } catch (const InputError& e) {
    if (e.code() != Errc::kUnexpectedMessage) return 0;
  }
  try {
    const compression::PartialView& p = h.decoder.decodePartial(bytes);
    auto round = h.schemes[0]->begin(kRound, h.schemes[0]->initialCarry());
    try {
      round->current().merge(p, 1);
    } catch (const InputError&) {
      return 0;
    }
    honestRoundsStillWork(*h.schemes[0], std::move(round),
                          HonestClient{1, ClientState(h.layout->fingerprint())});
    return 1;
  } catch (const InputError&) {
    return 0;
  }
}

}  // namespace starling::fuzz

namespace starling::fuzz {

// The structure-aware seed set: for every scheme, an update its own compressor produced for the
// round the harness opens (so it passes every check and the fuzzer starts from deep inside the
// accepting path), plus one partial aggregate.
inline std::vector<std::vector<uint8_t>> schemeSeeds(Harness& h) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& scheme : h.schemes) {
    auto round = scheme->begin(kRound, scheme->initialCarry());
    ClientState st(h.layout->fingerprint());
    std::vector<float> update(h.layout->numel());
    for (size_t i = 0; i < update.size(); ++i)
      update[i] = 0.01f * static_cast<float>(static_cast<int>(i % 13) - 6);
    compression::Update u;
    u.header = {h.layout->fingerprint(), kRound, 0, 7, 60};
    u.tensors = scheme->compressor().compressWithFeedback(*h.layout, update, st,
                                                          round->broadcast().context(7));
    u.metrics = {{"loss", 0.25}};
    out.push_back(protocol::encodeUpdate(u));
    if (scheme->phases() > 1) {  // and its phase-Q update, against the P-hat of that round
      round->current().add(compression::view(u));
      round->nextPhase();
      compression::Update q;
      q.header = {h.layout->fingerprint(), kRound, 1, 7, 60};
      q.tensors = scheme->compressor().compressWithFeedback(*h.layout, {}, st,
                                                            round->broadcast().context(7));
      out.push_back(protocol::encodeUpdate(q));
      continue;
    }
    if (scheme.get() == h.schemes.front().get()) {
      round->current().add(compression::view(u));
      out.push_back(protocol::encodePartial(round->current().partial().exportDense()));
    }
  }
  return out;
}

}  // namespace starling::fuzz
