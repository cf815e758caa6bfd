#pragma once
// Aggregator-side driving of the low-rank compressors, shared by the server and the simulator.
//
// PowerSgdRound (two phases, Vogels et al. 2019):
//   phase P: every client sends P_i = M_i Q (Q = the round's shared Q); addPhaseP() sums
//            w_i P_i in factor space; finishPhaseP() orthogonalizes the sum into P-hat, which the
//            caller broadcasts.
//   phase Q: every client sends Q_i = M_i^T P-hat; addPhaseQ() sums w_i Q_i; finish() returns
//            the mean update P-hat (sum w_i Q_i)^T / W_Q plus the mean of the tensors that went
//            dense in phase P (/ W_P), and the next round's Q = sum w_i Q_i / W_Q (warm start).
//   A client that drops between the phases still shaped P-hat; its Q is simply missing.
//
// AcpSgdRound (Zhang, Shi et al. 2023): one phase. Clients send the factor opposite to the
//   shared one; add() sums it in factor space; finish() returns the mean update and the next
//   round's shared factors: the orthogonalized factor sum, now the fixed side.
#include "aggregation/partial.h"
#include "compression/lowrank.h"

namespace starling::aggregation {

class PowerSgdRound {
 public:
  // `q` must have side kQ (from initialSharedFactors, or the previous round's next_q).
  PowerSgdRound(const ParamLayout& layout, const SharedFactors& q);

  void addPhaseP(const Update& u, double weight);
  // Throws InvalidArgument if no update arrived in phase P.
  const SharedFactors& finishPhaseP();
  void addPhaseQ(const Update& u, double weight);
  // Mean update; `next_q` (if given) receives the next round's shared Q.
  std::vector<float> finish(SharedFactors* next_q = nullptr) const;

  const PartialAggregate& phaseP() const { return p_agg_; }
  const PartialAggregate& phaseQ() const;

 private:
  ParamLayout layout_;
  PartialAggregate p_agg_;
  SharedFactors p_hat_;
  std::unique_ptr<PartialAggregate> q_agg_;
};

class AcpSgdRound {
 public:
  explicit AcpSgdRound(const ParamLayout& layout, const SharedFactors& shared) : agg_(layout, &shared) {}
  void add(const Update& u, double weight) { agg_.add(u, weight); }
  PartialAggregate& partial() { return agg_; }
  // Mean update; `next` (if given) receives the next round's shared factors.
  std::vector<float> finish(SharedFactors* next = nullptr) const;

 private:
  PartialAggregate agg_;
};

// Orthogonalized factor sums of `agg`, as the opposite side's shared factors.
SharedFactors orthogonalizedFactorSums(const PartialAggregate& agg);

}  // namespace starling::aggregation
