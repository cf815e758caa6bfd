#include "aggregation/round_scheme.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <unordered_map>

#include "compression/registry.h"
#include "core/error.h"
#include "core/finite.h"

namespace starling::aggregation {
namespace cz = starling::compression;

// ---------------------------------------------------------------- carry, completion

void RoundCarry::save(ByteWriter& w) const {
  w.u8(static_cast<uint8_t>(shared.fixed));
  w.u64(shared.factors.size());
  for (const auto& f : shared.factors) w.floats(f);
}

RoundCarry RoundCarry::load(ByteReader& r, const ParamLayout& layout) {
  RoundCarry c;
  const uint8_t side = r.u8();
  if (side > 1) r.fail("shared factor side ", int{side});
  c.shared.fixed = static_cast<cz::SharedFactors::Side>(side);
  const uint64_t n = r.u64();
  if (n != 0 && n != layout.size())
    r.fail("shared factors for ", n, " tensors, the model has ", layout.size());
  c.shared.factors.resize(layout.size());
  for (uint64_t t = 0; t < n; ++t) {
    r.floats(c.shared.factors[t]);
    const auto& f = c.shared.factors[t];
    if (f.size() > layout[t].numel)
      r.fail("shared factor of tensor ", t, " has ", f.size(), " floats");
    if (!allFinite(f)) r.fail("shared factor of tensor ", t, " is not finite");
  }
  return c;
}

void CompletionPolicy::validate() const {
  if (min_results == 0) STARLING_THROW(ConfigError, "completion policy: min_results must be >= 1");
  if (!(min_completion_rate >= 0 && min_completion_rate <= 1))
    STARLING_THROW(ConfigError, "completion policy: min_completion_rate must be in [0, 1], got ",
                   min_completion_rate);
}

RoundDecision decideRound(const CompletionPolicy& p, uint64_t results, uint64_t failures) {
  p.validate();
  std::ostringstream why;
  if (results < p.min_results) {
    why << "round skipped: " << results << " results, at least " << p.min_results << " required";
    return {false, why.str()};
  }
  const double rate = static_cast<double>(results) / static_cast<double>(results + failures);
  if (rate < p.min_completion_rate) {
    why << "round skipped: completion rate " << rate << " (" << results << " of "
        << results + failures << ") below the required " << p.min_completion_rate;
    return {false, why.str()};
  }
  return {true, ""};
}

// ---------------------------------------------------------------- robust store

// The root's dense copy of every client's update (robust rules only): the parts of each phase
// that belong to the update, summed per client.
struct PhaseAggregator::RobustStore {
  struct Entry {
    std::vector<float> dense;
    double weight = 0.0;
    uint32_t phases = 0;  // bit p set once the client's phase-p update arrived
  };
  std::unordered_map<uint64_t, Entry> clients;
};

// ---------------------------------------------------------------- phase aggregator

namespace {

// An update or partial for an earlier round or phase is late (or replayed); one for a round or
// phase that has not started is wrong. Servers count them apart.
void checkRoundAndPhase(uint64_t round, uint32_t phase, const PhaseBroadcast& b, const char* what,
                        uint64_t who) {
  if (round == b.round && phase == b.phase) return;
  const bool late = round < b.round || (round == b.round && phase < b.phase);
  failInput(late ? Errc::kLate : Errc::kWrongRound, what, " ", who, " is for round ", round,
            " phase ", phase, "; this is round ", b.round, " phase ", b.phase);
}

}  // namespace

namespace {

// Adaptive clipping's count is filled by each aggregation point itself: a metric of that name from
// a client or a child's partial is refused (kBadMetric).
void refuseClipIndicator(const RoundSchemeOptions& o, std::string_view name, const char* who,
                         uint64_t id) {
  if (!o.clip_indicator.empty() && name == o.clip_indicator)
    failInput(Errc::kBadMetric, who, " ", id, ": metric '", name,
              "' is the server's own (adaptive clipping's count)");
}

}  // namespace

PhaseAggregator::PhaseAggregator(const RoundScheme& scheme, PhaseBroadcast b, RobustStore* robust,
                                 const std::unordered_set<uint64_t>* allowed)
    : scheme_(scheme),
      broadcast_(std::move(b)),
      partial_(scheme.aggregateLayout(broadcast_)),
      clip_(scheme.rule_->clipNorm()),
      robust_(robust),
      allowed_(allowed) {}

void PhaseAggregator::reject(const InputError& e) {
  ++rejected_;
  ++by_code_[static_cast<size_t>(e.code())];
  throw e;
}

void PhaseAggregator::add(const cz::UpdateView& u, const ClientLimits& limits, double staleness) {
  STARLING_CHECK_ARG(std::isfinite(staleness) && staleness > 0.0 && staleness <= 1.0,
                     "a staleness weight must be in (0, 1], got ", staleness);
  STARLING_CHECK_ARG(staleness == 1.0 || !robust_, "aggregation rule ", scheme_.rule_->name(),
                     " takes no staleness weights (it does not stream)");
  try {
    addChecked(u, limits, staleness);
  } catch (const InputError& e) {
    reject(e);
  }
  ++accepted_;
}

void PhaseAggregator::addChecked(const cz::UpdateView& u, const ClientLimits& limits,
                                 double staleness) {
  const ParamLayout& layout = scheme_.layout();
  const ValidationBounds& bounds = scheme_.opt_.bounds;
  const auto& h = u.header;
  checkRoundAndPhase(h.round, h.phase, broadcast_, "update from client", h.client_id);
  cz::checkUpdateHeader(layout, h, u.tensors.size());
  if (seen_.count(h.client_id))
    failInput(Errc::kDuplicate, "client ", h.client_id, " already sent its update for round ",
              h.round, " phase ", h.phase);
  if (allowed_ && !allowed_->count(h.client_id))
    failInput(Errc::kWrongRound, "client ", h.client_id, " sent phase ", h.phase,
              " without the earlier phase");

  // The weight a client may claim.
  const uint64_t cap = limits.max_examples ? std::min(limits.max_examples, bounds.max_examples)
                                           : bounds.max_examples;
  if (h.num_examples > cap)
    failInput(Errc::kBadWeight, "client ", h.client_id, " claims ", h.num_examples,
              " examples, at most ", cap,
              limits.max_examples ? " (what the server knows of it)" : " (the round's bound)");
  const bool by_examples = scheme_.rule_->weightsByExamples();
  if (by_examples && h.num_examples == 0)
    failInput(Errc::kBadWeight, "client ", h.client_id, " reports 0 examples, and ",
              scheme_.rule_->name(), " weights updates by examples");
  const double weight = by_examples ? static_cast<double>(h.num_examples) : 1.0;

  // What the compressor sends, then every payload, then the bounds.
  const cz::SharedFactors* shared = broadcast_.shared.get();
  const cz::RoundContext ctx = broadcast_.context(h.client_id);
  double sq_norm = 0.0;
  for (size_t t = 0; t < layout.size(); ++t) {
    scheme_.compressor_->checkReceived(layout, t, u.tensors[t], ctx);
    const cz::PayloadStats s = cz::validatePayload(u.tensors[t], layout[t], shared, t);
    if (s.max_abs > bounds.max_abs_value)
      failInput(Errc::kValueTooLarge, "client ", h.client_id, ": tensor ", t, " '", layout[t].name,
                "' has a decoded magnitude up to ", s.max_abs, ", the bound is ",
                bounds.max_abs_value);
    if (s.declared_norm > bounds.max_update_norm)
      failInput(Errc::kNormTooLarge, "client ", h.client_id, ": tensor ", t, " '", layout[t].name,
                "' states a norm of ", s.declared_norm, ", the bound is ", bounds.max_update_norm);
    sq_norm += s.sq_norm;
  }
  const double norm = std::sqrt(sq_norm);
  if (!(norm <= bounds.max_update_norm))
    failInput(Errc::kNormTooLarge, "client ", h.client_id, ": update norm ", norm,
              " exceeds the bound ", bounds.max_update_norm);
  for (const auto& m : u.metrics) {
    if (!(std::fabs(m.value) <= bounds.max_metric_abs))
      failInput(Errc::kBadMetric, "client ", h.client_id, ": metric '", m.name, "' = ", m.value,
                " exceeds the bound ", bounds.max_metric_abs);
    refuseClipIndicator(scheme_.opt_, m.name, "client", h.client_id);
  }
  checkControl(u.control, 1.0, "client", h.client_id);
  const double clip = clip_;
  // The clip, then the staleness weight of an asynchronous update (1 in a synchronous round).
  const double scale = ((clip > 0 && norm > clip) ? clip / norm : 1.0) * staleness;

  // Everything that allocates happens before the aggregate changes.
  seen_.insert(h.client_id);
  bool created = false;
  try {
    if (robust_) {
      auto [it, inserted] = robust_->clients.try_emplace(h.client_id);
      created = inserted;
      auto& e = it->second;
      if (e.dense.empty()) e.dense.assign(layout.numel(), 0.0f);
      const bool factors_count = scheme_.compressor_->factorsAreUpdate(h.phase);
      for (size_t t = 0; t < layout.size(); ++t) {
        const auto* lr = std::get_if<cz::LowRankView>(&u.tensors[t]);
        if (lr && lr->oneFactor() && !factors_count) continue;  // a probe, not part of the update
        cz::accumulatePayload(u.tensors[t], layout[t], layout.slice(std::span<float>(e.dense), t),
                              static_cast<float>(scale), shared, t);
      }
      e.weight = weight;
      e.phases |= 1u << h.phase;
    }
    partial_.addValidated(u, weight, scale);
    if (!scheme_.opt_.clip_indicator.empty())
      partial_.addMetric(scheme_.opt_.clip_indicator, (clip > 0 && norm > clip) ? 0.0 : 1.0,
                         weight);
  } catch (...) {
    seen_.erase(h.client_id);
    if (created) robust_->clients.erase(h.client_id);
    throw;
  }
}

void PhaseAggregator::merge(const cz::PartialView& p, uint64_t source, double staleness) {
  STARLING_CHECK_ARG(
      scheme_.rule_->streaming(), "aggregation rule ", scheme_.rule_->name(),
      " needs every update at the root and cannot merge partial aggregates (no edge aggregators)");
  STARLING_CHECK_ARG(std::isfinite(staleness) && staleness > 0.0 && staleness <= 1.0,
                     "a staleness weight must be in (0, 1], got ", staleness);
  try {
    mergeChecked(p, source, staleness);
  } catch (const InputError& e) {
    reject(e);
  }
}

// SCAFFOLD's control vector of an update (count 1) or a partial (the sum of `count` changes): there
// exactly when the phase takes one, numel finite values, each change within the update bounds
// (|value| <= max_abs_value, norm <= max_update_norm), so the sum stays within count times them.
void PhaseAggregator::checkControl(std::span<const float> control, double count, const char* what,
                                   uint64_t who) const {
  const AggregateLayout& L = partial_.layout();
  const ValidationBounds& bounds = scheme_.opt_.bounds;
  if (!L.hasControl()) {
    if (!control.empty())
      failInput(Errc::kUnexpectedEncoding, what, " ", who,
                " carries a SCAFFOLD control vector, and this phase takes none");
    return;
  }
  if (control.empty())
    failInput(Errc::kMissingField, what, " ", who,
              " carries no SCAFFOLD control vector (c_i+ - c_i), which this round needs");
  if (control.size() != L.numel())
    failInput(Errc::kSizeMismatch, what, " ", who, ": SCAFFOLD control vector of ", control.size(),
              " values, the model has ", L.numel());
  const double slack = 1 + 1e-5;
  double sq = 0.0, top = 0.0;
  for (float x : control) {
    if (!std::isfinite(x))
      failInput(Errc::kNonFinite, what, " ", who, ": its SCAFFOLD control vector is not finite");
    top = std::max(top, static_cast<double>(std::fabs(x)));
    sq += static_cast<double>(x) * x;
  }
  if (top > count * bounds.max_abs_value * slack)
    failInput(Errc::kValueTooLarge, what, " ", who, ": a SCAFFOLD control value of ", top,
              ", the bound is ", count * bounds.max_abs_value);
  if (!(std::sqrt(sq) <= count * bounds.max_update_norm * slack))
    failInput(Errc::kNormTooLarge, what, " ", who, ": SCAFFOLD control norm ", std::sqrt(sq),
              ", the bound is ", count * bounds.max_update_norm);
}

void PhaseAggregator::mergeChecked(const cz::PartialView& p, uint64_t source, double staleness) {
  const ParamLayout& layout = scheme_.layout();
  const ValidationBounds& bounds = scheme_.opt_.bounds;
  const AggregateLayout& L = partial_.layout();
  const auto& h = p.header;
  if (h.layout_fingerprint != layout.fingerprint())
    failInput(Errc::kFingerprintMismatch, "partial from ", source, " is for another model");
  checkRoundAndPhase(h.round, h.phase, broadcast_, "partial from", source);
  if (h.shared_tag != L.sharedTag())
    failInput(Errc::kRoundMismatch, "partial from ", source, " was made with other shared factors");
  if (p.tensors.size() != layout.size())
    failInput(Errc::kTensorCountMismatch, "partial from ", source, " carries ", p.tensors.size(),
              " tensors");
  if (sources_.count(source))
    failInput(Errc::kDuplicate, "partial from ", source, " already merged in this phase");
  if (h.count == 0 || h.count > bounds.max_partial_count)
    failInput(Errc::kBadWeight, "partial from ", source, " claims ", h.count, " updates (1 to ",
              bounds.max_partial_count, " allowed)");
  const double per =
      scheme_.rule_->weightsByExamples() ? static_cast<double>(bounds.max_examples) : 1.0;
  const double max_weight = static_cast<double>(h.count) * per;
  // Every update weighs at least 1 (1 example, or uniform weight 1); the float sums carry a
  // relative error of about 1e-7, hence the slack.
  const double min_weight = static_cast<double>(h.count) * (1 - 1e-5);
  if (!(std::isfinite(h.total_weight) && h.total_weight >= min_weight &&
        h.total_weight <= max_weight))
    failInput(Errc::kBadWeight, "partial from ", source, " claims total weight ", h.total_weight,
              " for ", h.count, " updates (between ", min_weight, " and ", max_weight, ")");
  // A sum of updates each within the bounds is within W times them: |sum_i w_i v_i| <= W * bound
  // and ||sum_i w_i u_i|| <= W * norm bound (for factor sums through the same Cauchy-Schwarz bound
  // as single updates). A re-sparsified export may add mass its edge dropped in earlier rounds:
  // sparse partials get max_partial_slack.
  bool sparse = false;
  for (const auto& v : p.tensors) sparse |= std::holds_alternative<cz::SparseView>(v);
  const double slack = (sparse ? bounds.max_partial_slack : 1.0) * (1 + 1e-5);
  const double value_bound = h.total_weight * bounds.max_abs_value * slack;
  const double norm_bound = h.total_weight * bounds.max_update_norm * slack;
  double sq_norm = 0.0;
  const cz::SharedFactors* shared = &L.shared();
  for (size_t t = 0; t < layout.size(); ++t) {
    const auto& v = p.tensors[t];
    const auto* lr = std::get_if<cz::LowRankView>(&v);
    if (L.hasFactorSlot(t)) {
      if (!lr || !lr->oneFactor())
        failInput(Errc::kUnexpectedEncoding, "partial from ", source, ": tensor ", t,
                  " must be its factor sum");
    } else if (!std::holds_alternative<cz::DenseF32View>(v) &&
               !std::holds_alternative<cz::SparseView>(v)) {
      failInput(Errc::kUnexpectedEncoding, "partial from ", source, ": tensor ", t, " arrived as ",
                cz::encodingName(v), ", a partial sum is dense_f32 or sparse");
    }
    const cz::PayloadStats s = cz::validatePayload(v, layout[t], shared, t);
    if (lr && (lr->p.empty() ? lr->q.size() : lr->p.size()) != L.factorSize(t))
      failInput(Errc::kShapeMismatch, "partial from ", source, ": factor sum of tensor ", t,
                " has the wrong size");
    if (s.max_abs > value_bound)
      failInput(Errc::kValueTooLarge, "partial from ", source, ": tensor ", t,
                " has a magnitude up to ", s.max_abs, ", more than updates of total weight ",
                h.total_weight, " can sum to (", value_bound, ")");
    sq_norm += s.sq_norm;
  }
  if (!(std::sqrt(sq_norm) <= norm_bound))
    failInput(Errc::kNormTooLarge, "partial from ", source, ": norm ", std::sqrt(sq_norm),
              ", more than updates of total weight ", h.total_weight, " can sum to (", norm_bound,
              ")");
  checkControl(p.control, static_cast<double>(h.count), "partial from", source);
  for (const auto& m : p.metrics) {
    if (!(m.weight >= 0 && m.weight <= h.total_weight * (1 + 1e-6) &&
          std::fabs(m.weighted_sum) <= m.weight * bounds.max_metric_abs * (1 + 1e-6)))
      failInput(Errc::kBadMetric, "partial from ", source, ": metric '", m.name, "' sums ",
                m.weighted_sum, " over weight ", m.weight, ", outside the bounds");
    refuseClipIndicator(scheme_.opt_, m.name, "partial from", source);  // each point's own
  }
  sources_.insert(source);
  partial_.mergeValidated(p, staleness);
  ++accepted_;
}

void PhaseAggregator::merge(const PartialAggregate& p) {
  STARLING_CHECK_ARG(scheme_.rule_->streaming(), "aggregation rule ", scheme_.rule_->name(),
                     " cannot merge partial aggregates");
  partial_.merge(p);
}

// ---------------------------------------------------------------- scheme

RoundScheme::RoundScheme(std::shared_ptr<const ParamLayout> layout, RoundSchemeOptions options)
    : layout_(std::move(layout)), opt_(std::move(options)) {
  STARLING_CHECK_ARG(layout_ != nullptr && !layout_->empty(),
                     "round scheme: the model layout is empty");
  opt_.bounds.validate();
  if (!opt_.clip_indicator.empty() && std::find(opt_.metrics.begin(), opt_.metrics.end(),
                                                opt_.clip_indicator) != opt_.metrics.end())
    STARLING_THROW(ConfigError, "round scheme: metric '", opt_.clip_indicator,
                   "' is the clip indicator, which clients do not send");
  for (size_t i = 0; i < opt_.metrics.size(); ++i) {
    const auto& n = opt_.metrics[i];
    if (n.empty() || n.size() > 64)
      STARLING_THROW(ConfigError, "round scheme: metric name '", n,
                     "' must have 1 to 64 characters");
    for (size_t j = 0; j < i; ++j)
      if (opt_.metrics[j] == n)
        STARLING_THROW(ConfigError, "round scheme: metric '", n, "' declared twice");
  }
  compressor_ = cz::makeCompressor(opt_.compressor);
  rule_ = makeRule(opt_.rule);
}

RoundScheme::~RoundScheme() = default;

RoundCarry RoundScheme::initialCarry() const {
  return RoundCarry{compressor_->initialShared(*layout_, opt_.run_seed)};
}

std::shared_ptr<const AggregateLayout> RoundScheme::aggregateLayout(const PhaseBroadcast& b) const {
  std::vector<std::string> metrics = opt_.metrics;
  if (!opt_.clip_indicator.empty()) metrics.push_back(opt_.clip_indicator);
  return std::make_shared<const AggregateLayout>(layout_, b.round, b.phase, b.shared, metrics,
                                                 opt_.scaffold && b.phase == 0);
}

std::unique_ptr<PhaseAggregator> RoundScheme::phaseAggregator(
    const PhaseBroadcast& b, const PhaseAggregator* previous) const {
  STARLING_CHECK_ARG(
      rule_->streaming(), "aggregation rule ", rule_->name(),
      " needs every update at the root: it cannot run at an edge aggregator or simulator worker");
  STARLING_CHECK_ARG(b.phase < phases(), "round scheme: phase ", b.phase, " does not exist (",
                     phases(), " per round)");
  STARLING_CHECK_ARG(!previous || (previous->broadcast().round == b.round &&
                                   previous->broadcast().phase + 1 == b.phase),
                     "round scheme: the previous aggregator is not of the phase before round ",
                     b.round, " phase ", b.phase);
  return std::unique_ptr<PhaseAggregator>(
      new PhaseAggregator(*this, b, nullptr, previous ? &previous->clients() : nullptr));
}

void RoundScheme::checkCarry(const RoundCarry& carry) const {
  const cz::SharedFactors want = compressor_->initialShared(*layout_, opt_.run_seed);
  const auto& got = carry.shared;
  const bool none = !got.any();
  STARLING_CHECK_ARG(none == !want.any(),
                     "round carry: ", none ? "no shared factors, but " : "shared factors, but ",
                     compressor_->spec(), none ? " shares factors" : " shares none");
  if (none) return;
  STARLING_CHECK_ARG(got.factors.size() == layout_->size(), "round carry: factors for ",
                     got.factors.size(), " tensors, the model has ", layout_->size());
  for (size_t t = 0; t < layout_->size(); ++t) {
    const TensorSpec& spec = (*layout_)[t];
    const size_t rank =
        want.factors[t].empty() ? 0 : want.factors[t].size() / spec.cols();  // initial side is Q
    const size_t dim = got.fixed == cz::SharedFactors::Side::kQ ? spec.cols() : spec.rows();
    STARLING_CHECK_ARG(got.factors[t].size() == rank * dim, "round carry: the factor of tensor '",
                       spec.name, "' has ", got.factors[t].size(), " floats, ", compressor_->spec(),
                       " shares ", rank * dim);
    STARLING_CHECK_ARG(allFinite(got.factors[t]), "round carry: the factor of tensor '", spec.name,
                       "' is not finite");
  }
}

std::unique_ptr<Round> RoundScheme::begin(uint64_t round, const RoundCarry& carry) const {
  checkCarry(carry);
  return std::unique_ptr<Round>(new Round(*this, round, carry));
}

// ---------------------------------------------------------------- round

Round::Round(const RoundScheme& scheme, uint64_t number, const RoundCarry& carry)
    : scheme_(scheme), number_(number) {
  if (!scheme.rule().streaming()) robust_ = std::make_unique<PhaseAggregator::RobustStore>();
  PhaseBroadcast b{scheme.options().run_seed, number, 0, nullptr};
  if (carry.shared.any()) b.shared = std::make_shared<const cz::SharedFactors>(carry.shared);
  phases_.push_back(
      std::unique_ptr<PhaseAggregator>(new PhaseAggregator(scheme, b, robust_.get(), nullptr)));
}

Round::~Round() = default;

void Round::nextPhase() {
  STARLING_CHECK_ARG(!lastPhase(), "round ", number_, ": phase ", phase(), " is the last");
  PhaseAggregator& cur = current();
  STARLING_CHECK_ARG(!cur.partial().empty(), "round ", number_, " phase ", phase(),
                     ": no update arrived");
  const AggregateLayout& L = cur.partial().layout();
  const auto sums = cur.partial().factorSums();
  cz::RoundContext ctx = cur.broadcast().context(0);
  PhaseBroadcast b{cur.broadcast().run_seed, number_, phase() + 1, nullptr};
  cz::SharedFactors next = scheme_.compressor().nextShared(scheme_.layout(), ctx, L.shared(), sums,
                                                           cur.partial().totalWeight());
  if (next.any()) b.shared = std::make_shared<const cz::SharedFactors>(std::move(next));
  phases_.push_back(std::unique_ptr<PhaseAggregator>(
      new PhaseAggregator(scheme_, std::move(b), robust_.get(), &cur.clients())));
  if (clip_ > 0) phases_.back()->clip_ = clip_;
}

void Round::setClip(double clip) {
  STARLING_CHECK_ARG(std::isfinite(clip) && clip > 0, "round ", number_, ": a clip of ", clip);
  STARLING_CHECK_ARG(current().partial().empty(), "round ", number_,
                     ": the clip is set before any update is added");
  clip_ = clip;
  current().clip_ = clip;
}

RoundResult Round::finish() {
  STARLING_CHECK_ARG(lastPhase(), "round ", number_, ": finish() in phase ", phase(), " of ",
                     scheme_.phases());
  const ParamLayout& layout = scheme_.layout();
  const cz::Compressor& comp = scheme_.compressor();
  RoundResult res;
  for (const auto& p : phases_) {
    STARLING_CHECK_ARG(!p->partial().empty(), "round ", number_, " phase ", p->broadcast().phase,
                       ": no update arrived");
    res.rejected += p->rejected();
  }
  res.delta.assign(layout.numel(), 0.0f);
  if (robust_) {
    // Only clients that delivered every phase have a whole update.
    const uint32_t all = (1u << scheme_.phases()) - 1;
    std::vector<uint64_t> ids;
    for (const auto& [id, e] : robust_->clients)
      if (e.phases == all) ids.push_back(id);
    std::sort(ids.begin(), ids.end());  // the rules' tie-breaks follow input order: make it stable
    DenseUpdates updates;
    std::vector<double> weights;
    for (uint64_t id : ids) {
      auto& e = robust_->clients[id];
      updates.push_back(std::move(e.dense));
      weights.push_back(e.weight);
    }
    STARLING_CHECK_ARG(!updates.empty(), "round ", number_, ": no client delivered every phase");
    res.delta = scheme_.rule().combine(updates, weights);
  } else {
    for (const auto& p : phases_)
      p->partial().meanInto(res.delta, comp.factorsAreUpdate(p->broadcast().phase), /*add=*/true);
  }
  // Metrics: every phase's declared metrics, weighted.
  std::map<std::string, std::pair<double, double>> acc;
  for (const auto& p : phases_) {
    const AggregateLayout& L = p->partial().layout();
    const auto buf = p->partial().buffer();
    for (size_t i = 0; i < L.metricNames().size(); ++i) {
      auto& a = acc[L.metricNames()[i]];
      a.first += buf[L.metricOffset(i)];
      a.second += buf[L.metricOffset(i) + 1];
    }
  }
  for (const auto& [k, v] : acc)
    if (v.second > 0) res.metrics[k] = v.first / v.second;
  PhaseAggregator& last = current();
  res.count = last.partial().count();
  res.total_weight = last.partial().totalWeight();
  const auto sums = last.partial().factorSums();
  res.next.shared = comp.nextShared(layout, last.broadcast().context(0),
                                    last.partial().layout().shared(), sums, res.total_weight);
  STARLING_ENFORCE(allFinite(res.delta), "round ", number_,
                   ": the aggregate is not finite despite the bounds");
  return res;
}

}  // namespace starling::aggregation
