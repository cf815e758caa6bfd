#pragma once
// The model the decoder fuzzer and its corpus replay decode against, and a valid update of every
// encoding for it (the corpus seeds).
#include <vector>

#include "compression/lowrank.h"
#include "compression/payload.h"
#include "compression/rice.h"
#include "core/param_layout.h"

namespace starling::fuzz {

inline ParamLayout layout() {
  ParamLayout l;
  l.add("w", {8, 12});
  l.add("b", {8});
  return l;
}

// Shared factors for one-factor low-rank payloads: side kQ, rank 2 for "w".
inline compression::SharedFactors shared() {
  compression::LowRankOptions o;
  o.rank = 2;
  o.min_compression_rate = 1.0;
  return compression::initialSharedFactors(layout(), o, 1);
}

inline std::vector<compression::Update> seedUpdates() {
  namespace cz = compression;
  const ParamLayout l = layout();
  std::vector<float> w(96), b(8);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 7) - 3.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.5f * static_cast<float>(i);
  auto make = [&](cz::Payload pw) {
    cz::Update u;
    u.header.layout_fingerprint = l.fingerprint();
    u.header.round = 3;
    u.header.client_id = 7;
    u.header.num_examples = 60;
    u.tensors = {std::move(pw), cz::DenseF32{b}};
    u.metrics = {{"loss", 0.25}};
    return u;
  };
  std::vector<cz::Update> out;
  out.push_back(make(cz::DenseF32{w}));
  out.push_back(make(cz::DenseF16{std::vector<uint16_t>(96, 0x3c00)}));
  out.push_back(make(cz::DenseBF16{std::vector<uint16_t>(96, 0x3f80)}));
  out.push_back(make(cz::Sparse{{1, 5, 90}, {1.0f, -2.0f, 3.0f}}));
  out.push_back(make(cz::RandBlock{90, {1, 2, 3, 4, 5, 6, 7, 8}}));
  out.push_back(
      make(cz::LowRank{8, 12, 2, std::vector<float>(16, 0.5f), std::vector<float>(24, 0.25f)}));
  out.push_back(make(cz::LowRank{8, 12, 2, std::vector<float>(16, 0.5f), {}}));
  out.push_back(make(cz::Sign{0.5f, std::vector<uint8_t>(12, 0xa5)}));
  out.push_back(make(cz::Qsgd{2.0f, 3, std::vector<uint8_t>(36, 0x24)}));
  // Positions 1, 5, 90 (gaps 1, 3, 84) with Rice parameter 4, signs + - +.
  out.push_back(
      make(cz::Ternary{3, 0.75f, 4, cz::riceEncode(std::vector<uint32_t>{1, 5, 90}, 4), {0x02}}));
  // Two blocks (64 and 32 values) of 2-bit levels on steps 2^-3 and 2^2.
  out.push_back(make(cz::BlockQ{2, 64, {-3, 2}, std::vector<uint8_t>(24, 0x1b)}));
  return out;
}

}  // namespace starling::fuzz
