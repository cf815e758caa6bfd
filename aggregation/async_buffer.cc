#include "aggregation/async_buffer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace starling::aggregation {

namespace {

// "name:k=v,k=v" -> name and its parameters; ConfigError naming the spec on a malformed one.
std::pair<std::string, std::map<std::string, double>> splitSpec(std::string_view spec) {
  const size_t colon = spec.find(':');
  std::string name(spec.substr(0, colon));
  std::map<std::string, double> params;
  if (colon == std::string_view::npos) return {name, params};
  std::string_view rest = spec.substr(colon + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0)
      STARLING_THROW(ConfigError, "staleness '", spec, "': '", item, "' is not key=value");
    const std::string value(item.substr(eq + 1));
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(v))
      STARLING_THROW(ConfigError, "staleness '", spec, "': '", value, "' is not a number");
    if (!params.emplace(std::string(item.substr(0, eq)), v).second)
      STARLING_THROW(ConfigError, "staleness '", spec, "': '", item.substr(0, eq),
                     "' is given twice");
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return {name, params};
}

}  // namespace

Staleness Staleness::parse(std::string_view spec) {
  auto [name, params] = splitSpec(spec);
  Staleness s;
  s.spec_ = std::string(spec);
  const auto take = [&](const char* key, bool required, double fallback) {
    auto it = params.find(key);
    if (it == params.end()) {
      if (required)
        STARLING_THROW(ConfigError, "staleness '", spec, "': ", name, " needs ", key, "= (", name,
                       "'s parameters: constant; polynomial:a=A; hinge:a=A,b=B)");
      return fallback;
    }
    const double v = it->second;
    params.erase(it);
    return v;
  };
  if (name == "constant") {
    s.kind_ = Kind::kConstant;
  } else if (name == "polynomial") {
    s.kind_ = Kind::kPolynomial;
    s.a_ = take("a", false, 0.5);
    if (!(s.a_ > 0 && s.a_ <= 100))
      STARLING_THROW(ConfigError, "staleness '", spec, "': a must be in (0, 100]");
  } else if (name == "hinge") {
    s.kind_ = Kind::kHinge;
    s.a_ = take("a", true, 0);
    s.b_ = take("b", true, 0);
    if (!(s.a_ > 0 && s.a_ <= 1e6))
      STARLING_THROW(ConfigError, "staleness '", spec, "': a must be in (0, 1e6]");
    if (!(s.b_ >= 0 && s.b_ <= 1e9 && s.b_ == std::floor(s.b_)))
      STARLING_THROW(ConfigError, "staleness '", spec,
                     "': b must be a whole number of versions, 0 to 1e9");
  } else {
    STARLING_THROW(ConfigError, "staleness '", spec, "': unknown kind '", name,
                   "' (constant, polynomial:a=0.5, hinge:a=A,b=B)");
  }
  if (!params.empty())
    STARLING_THROW(ConfigError, "staleness '", spec, "': ", name, " takes no parameter '",
                   params.begin()->first, "'");
  return s;
}

double Staleness::weight(uint64_t tau) const {
  const double t = static_cast<double>(tau);
  switch (kind_) {
    case Kind::kConstant:
      return 1.0;
    case Kind::kPolynomial:
      return std::pow(1.0 + t, -a_);
    case Kind::kHinge:
      return t <= b_ ? 1.0 : 1.0 / (a_ * (t - b_) + 1.0);
  }
  return 1.0;
}

void AsyncOptions::validate() const {
  if (buffer_size < 1 || buffer_size > 1'000'000)
    STARLING_THROW(ConfigError, "async.buffer_size must be 1 to 1,000,000, got ", buffer_size);
  if (max_staleness > 1'000'000)
    STARLING_THROW(ConfigError, "async.max_staleness must be at most 1,000,000, got ",
                   max_staleness);
  Staleness::parse(staleness);
}

void AsyncOptions::checkWeightAtBound() const {
  const double at_bound = Staleness::parse(staleness).weight(max_staleness);
  if (!(at_bound >= 1e-6))
    STARLING_THROW(ConfigError, "async.staleness = '", staleness, "' weighs an update ",
                   max_staleness, " versions old (async.max_staleness) ", at_bound,
                   ", below 1e-6: it would count toward K and add nothing; lower "
                   "async.max_staleness");
}

void checkBufferable(const compression::Compressor& compressor, const AggregationRule& rule,
                     bool scaffold) {
  if (scaffold)
    STARLING_THROW(ConfigError,
                   "does not run SCAFFOLD: its control variate needs every counted client to have "
                   "trained against the same c, and a buffered step mixes model versions (set "
                   "train.scaffold = false, or round.mode = sync)");
  if (compressor.phases() != 1 || compressor.sharesFactors())
    STARLING_THROW(ConfigError, "does not run ",
                   compressor.phases() != 1 ? "a compressor of several phases"
                                            : "a compressor that shares factors across rounds",
                   " (compression.compressor = '", compressor.spec(),
                   "'): its step needs a one-phase compressor without shared factors");
  if (!rule.streaming())
    STARLING_THROW(ConfigError, "does not run a rule that keeps every update (aggregation.rule = '",
                   rule.spec(), "'): its step needs a streaming rule, fedavg, clipped or not");
}

AsyncBuffer::AsyncBuffer(const RoundScheme& scheme, AsyncOptions options, uint64_t version)
    : scheme_(scheme),
      opt_((options.validate(), std::move(options))),
      staleness_(Staleness::parse(opt_.staleness)),
      version_(version) {
  STARLING_CHECK_ARG(version >= 1, "asynchronous aggregation: the model version starts at 1, got ",
                     version);
  try {
    checkBufferable(scheme.compressor(), scheme.rule(), scheme.options().scaffold);
  } catch (const ConfigError& e) {
    STARLING_THROW(ConfigError, "asynchronous aggregation ", e.what());
  }
  opt_.checkWeightAtBound();
}

PhaseBroadcast AsyncBuffer::broadcast(uint64_t v) const {
  return PhaseBroadcast{scheme_.options().run_seed, v, 0, nullptr};
}

double AsyncBuffer::weightFor(uint64_t v) const {
  if (v > version_ || v == 0)
    failInput(Errc::kWrongRound, "an update trained from model version ", v,
              ", and the server's is ", version_);
  const uint64_t tau = version_ - v;
  if (tau > opt_.max_staleness)
    failInput(Errc::kStale, "an update trained from model version ", v, ", ", tau,
              " versions ago; the bound is ", opt_.max_staleness);
  return staleness_.weight(tau);
}

void AsyncBuffer::add(const compression::UpdateView& u, const ClientLimits& limits) {
  buffer(u.header.round, u.header.client_id, 1, "client", "update",
         [&](PhaseAggregator& agg, double s) { agg.add(u, limits, s); });
}

void AsyncBuffer::addPartial(const compression::PartialView& p, uint64_t source) {
  buffer(p.header.round, source, p.header.count, "edge aggregator", "partial",
         [&](PhaseAggregator& agg, double s) { agg.merge(p, source, s); });
}

void AsyncBuffer::buffer(uint64_t v, uint64_t sender, uint64_t count, const char* who,
                         const char* what,
                         const std::function<void(PhaseAggregator&, double)>& into) {
  double s = 0.0;
  try {
    s = weightFor(v);
    // One update (or partial) per sender and version, across steps too (a replay after take()).
    const auto seen = seen_.find(v);
    if (seen != seen_.end() && seen->second.count(sender))
      failInput(Errc::kDuplicate, who, " ", sender, " already sent its ", what,
                " from model version ", v);
    // A version's sum counts its updates in a float: exact, and what load() takes back, up to
    // 2^24.
    const auto buffered = by_version_.find(v);
    const uint64_t held = buffered == by_version_.end() ? 0 : buffered->second->count();
    if (count > kMaxVersionCount - held)
      failInput(Errc::kBadWeight, who, " ", sender, ": ", count,
                " more updates from model version ", v, " would take its ", held, " past ",
                kMaxVersionCount);
  } catch (const InputError&) {
    countRefusal();
    throw;
  }
  auto it = by_version_.find(v);
  std::unique_ptr<PhaseAggregator> fresh;
  PhaseAggregator* agg = nullptr;
  if (it != by_version_.end()) {
    agg = it->second.get();
  } else {
    fresh = scheme_.phaseAggregator(broadcast(v));
    agg = fresh.get();
  }
  auto& seen = seen_[v];  // what allocates happens before the aggregate changes
  seen.reserve(seen.size() + 1);
  const uint64_t before = agg->count();
  try {
    into(*agg, s);
  } catch (const InputError&) {
    countRefusal();
    throw;
  }
  seen.emplace(sender, count);
  if (fresh) by_version_.emplace(v, std::move(fresh));
  count_ += agg->count() - before;
}

RoundResult AsyncBuffer::take() {
  STARLING_CHECK_ARG(count_ > 0, "asynchronous aggregation: take() from an empty buffer");
  // The versions' sums in one aggregate of the current version: the same structure (one phase, no
  // factor slots, no control sum), each update already checked against its own version's phase.
  auto round = scheme_.begin(version_, scheme_.initialCarry());
  std::span<float> sum = round->current().partial().buffer();
  for (const auto& [v, agg] : by_version_) {
    const std::span<const float> part = agg->partial().buffer();
    STARLING_ENFORCE(
        part.size() == sum.size() && agg->partial().layout().denseOffset() ==
                                         round->current().partial().layout().denseOffset(),
        "asynchronous aggregation: version ", v, "'s aggregate is laid out unlike the step's");
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  RoundResult res = round->finish();
  res.rejected = rejected_step_;
  last_taken_.clear();
  for (const auto& [v, agg] : by_version_) {
    for (uint64_t id : agg->clients()) last_taken_.emplace_back(v, id);
    for (uint64_t id : agg->sources()) last_taken_.emplace_back(v, id);
  }
  by_version_.clear();
  count_ = 0;
  rejected_step_ = 0;
  return res;
}

void AsyncBuffer::discardTaken() {
  for (const auto& [v, id] : last_taken_)
    if (auto it = seen_.find(v); it != seen_.end()) it->second.erase(id);
  last_taken_.clear();
}

uint64_t AsyncBuffer::takeRejected() {
  const uint64_t n = rejected_step_;
  rejected_step_ = 0;
  return n;
}

void AsyncBuffer::advance() {
  ++version_;
  // A version past the staleness bound takes no more updates: its clients need not be kept.
  while (!seen_.empty() && version_ - seen_.begin()->first > opt_.max_staleness)
    seen_.erase(seen_.begin());
}

bool AsyncBuffer::hasUpdate(uint64_t client, uint64_t v) const {
  const auto it = seen_.find(v);
  return it != seen_.end() && it->second.count(client) != 0;
}

void AsyncBuffer::save(ByteWriter& w) const {
  w.u64(version_);
  w.u64(count_);
  w.u64(rejected_total_);
  w.u64(rejected_step_);
  w.u64(by_version_.size());
  for (const auto& [v, agg] : by_version_) {
    w.u64(v);
    w.floats(agg->partial().buffer());
  }
  // Format 2: each sender with the updates it brought (1 for a client, a partial's count).
  w.u64(seen_.size());
  for (const auto& [v, ids] : seen_) {
    std::vector<std::pair<uint64_t, uint64_t>> sorted(ids.begin(), ids.end());
    std::sort(sorted.begin(), sorted.end());
    w.u64(v);
    w.u64(sorted.size());
    for (const auto& [id, n] : sorted) {
      w.u64(id);
      w.u64(n);
    }
  }
}

void AsyncBuffer::load(ByteReader& r, uint32_t format) {
  if (format < 1 || format > kFormat)
    r.fail("the buffer's format ", format, " is not 1 to ", kFormat);
  const uint64_t version = r.u64(), count = r.u64(), rejected_total = r.u64(),
                 rejected_step = r.u64();
  if (version == 0) r.fail("the asynchronous buffer's model version is 0");
  if (rejected_step > rejected_total)
    r.fail("the buffer counts ", rejected_step, " refusals since its last step, ", rejected_total,
           " in all");
  const auto inBound = [&](uint64_t v, const char* what) {
    if (v == 0 || v > version || version - v > opt_.max_staleness)
      r.fail(what, " from model version ", v, ", outside the staleness bound (version ", version,
             ", async.max_staleness ", opt_.max_staleness, "): resume with the same async.*");
  };
  std::map<uint64_t, std::unique_ptr<PhaseAggregator>> by_version;
  const uint64_t versions = r.u64();
  if (versions > opt_.max_staleness + 1)
    r.fail("the buffer holds ", versions,
           " versions' sums, more than async.max_staleness + 1 = ", opt_.max_staleness + 1,
           ": resume with the same async.*");
  uint64_t counted = 0;
  for (uint64_t i = 0; i < versions; ++i) {
    const uint64_t v = r.u64();
    inBound(v, "a buffered sum");
    std::vector<float> sum;
    r.floats(sum);
    auto agg = scheme_.phaseAggregator(broadcast(v));
    const std::span<float> buf = agg->partial().buffer();
    if (sum.size() != buf.size())
      r.fail("version ", v, "'s buffered sum has ", sum.size(), " values, this scheme's has ",
             buf.size(), " (resume with the same compressor, rule and metrics)");
    for (float x : sum)
      if (!std::isfinite(x)) r.fail("version ", v, "'s buffered sum holds a non-finite value");
    // What the round's bounds allow a sum of its count (a file that passes these cannot make the
    // step's mean non-finite): a whole count, weights of 1 to max_examples each, values of at most
    // max_abs_value.
    const auto& layout = agg->partial().layout();
    const double c = sum[layout.countOffset()], weight = sum[layout.weightOffset()];
    const auto& bounds = scheme_.options().bounds;
    if (!(c >= 1.0 && c <= static_cast<double>(kMaxVersionCount) && c == std::floor(c)))
      r.fail("version ", v, "'s buffered sum counts ", c, " updates");
    if (!(weight >= 1e-6 * c && weight <= c * static_cast<double>(bounds.max_examples)))
      r.fail("version ", v, "'s buffered sum weighs ", weight, " for ", c, " updates");
    // An edge aggregator's sparse partial may carry up to max_partial_slack times that (the mass
    // its re-sparsification kept back in earlier rounds), as PhaseAggregator::merge allows.
    const double slack = std::max(1.0, bounds.max_partial_slack) * (1 + 1e-5);
    for (float x : std::span<const float>(sum).subspan(layout.denseOffset(), layout.numel()))
      if (std::fabs(x) > weight * bounds.max_abs_value * slack)
        r.fail("version ", v, "'s buffered sum holds ", x, ", beyond its weight ", weight,
               " times bounds.max_abs ", bounds.max_abs_value);
    std::copy(sum.begin(), sum.end(), buf.begin());
    const uint64_t n = agg->partial().count();
    counted += n;
    if (!by_version.emplace(v, std::move(agg)).second) r.fail("version ", v, " is buffered twice");
  }
  if (counted != count) r.fail("the buffer counts ", count, " updates, its sums hold ", counted);
  std::map<uint64_t, std::unordered_map<uint64_t, uint64_t>> seen;
  const uint64_t seen_versions = r.u64();
  if (seen_versions > opt_.max_staleness + 1)
    r.fail("the buffer lists ", seen_versions, " versions' clients");
  for (uint64_t i = 0; i < seen_versions; ++i) {
    const uint64_t v = r.u64();
    inBound(v, "clients listed");
    const uint64_t n = r.u64();
    const size_t entry = format >= 2 ? 16 : 8;
    if (n > r.remaining() / entry)
      r.fail("truncated: lists ", n, " clients, only ", r.remaining(), " bytes left");
    auto& ids = seen[v];
    for (uint64_t k = 0; k < n; ++k) {
      const uint64_t id = r.u64();
      const uint64_t brought = format >= 2 ? r.u64() : 1;  // format 1: clients only
      if (brought == 0 || brought > kMaxVersionCount)
        r.fail("sender ", id, " of version ", v, " brought ", brought, " updates");
      if (!ids.emplace(id, brought).second) r.fail("a client listed twice for version ", v);
    }
  }
  // The senders listed for a version brought at least the updates its sum holds (more: some of
  // them went into earlier steps).
  for (const auto& [v, agg] : by_version) {
    uint64_t brought = 0;
    if (const auto it = seen.find(v); it != seen.end())
      for (const auto& [id, n] : it->second) brought += n;
    if (brought < agg->partial().count())
      r.fail("version ", v, "'s buffered updates are not all among its senders");
  }
  version_ = version;
  count_ = count;
  rejected_total_ = rejected_total;
  rejected_step_ = rejected_step;
  by_version_ = std::move(by_version);
  seen_ = std::move(seen);
}

}  // namespace starling::aggregation
