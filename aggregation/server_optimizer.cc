#include "aggregation/server_optimizer.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/error.h"
#include "core/finite.h"
#include "core/options.h"

namespace starling::aggregation {
namespace {

enum class Rule { kAvg, kAvgM, kAdagrad, kAdam, kYogi };

Rule ruleOf(const std::string& name) {
  if (name == "fedavg") return Rule::kAvg;
  if (name == "fedavgm") return Rule::kAvgM;
  if (name == "fedadagrad") return Rule::kAdagrad;
  if (name == "fedadam") return Rule::kAdam;
  if (name == "fedyogi") return Rule::kYogi;
  serverOptimizers().entry(name);  // throws the registry's "unknown server optimizer" error
  STARLING_THROW(InternalError, "server optimizer '", name, "' is registered but has no rule");
}

class Optimizer final : public ServerOptimizer {
 public:
  Optimizer(ServerOptimizerOptions o, size_t numel)
      : ServerOptimizer(std::move(o), numel), rule_(ruleOf(opt_.name)) {
    if (rule_ != Rule::kAvg) m_.assign(numel, 0.0f);
    if (rule_ != Rule::kAvg && rule_ != Rule::kAvgM)
      v_.assign(numel, static_cast<float>(opt_.tau * opt_.tau));
  }

 protected:
  void apply(std::span<float> x, std::span<const float> d) override {
    const float eta = static_cast<float>(opt_.eta), b1 = static_cast<float>(opt_.beta1),
                b2 = static_cast<float>(opt_.beta2), tau = static_cast<float>(opt_.tau);
    const size_t n = x.size();
    switch (rule_) {
      case Rule::kAvg:
        for (size_t i = 0; i < n; ++i) x[i] += eta * d[i];
        return;
      case Rule::kAvgM:
        for (size_t i = 0; i < n; ++i) {
          m_[i] = b1 * m_[i] + d[i];
          x[i] += eta * m_[i];
        }
        return;
      default:
        break;
    }
    for (size_t i = 0; i < n; ++i) {
      m_[i] = b1 * m_[i] + (1.0f - b1) * d[i];
      const float d2 = d[i] * d[i];
      switch (rule_) {
        case Rule::kAdagrad:
          v_[i] += d2;
          break;
        case Rule::kAdam:
          v_[i] = b2 * v_[i] + (1.0f - b2) * d2;
          break;
        case Rule::kYogi: {
          const float diff = v_[i] - d2;
          const float sgn = static_cast<float>((diff > 0.0f) - (diff < 0.0f));
          v_[i] -= (1.0f - b2) * d2 * sgn;
          break;
        }
        default:
          break;
      }
      x[i] += eta * m_[i] / (std::sqrt(v_[i]) + tau);
    }
  }

 private:
  Rule rule_;
};

constexpr uint32_t kMagic = 0x5354534f;  // "OSTS"
constexpr uint32_t kStateVersion = 2;

ServerOptimizerOptions readOptions(OptionReader& r, std::string name) {
  ServerOptimizerOptions o;
  o.name = std::move(name);
  o.eta = r.number("eta", o.eta);
  o.eta_l = r.number("eta_l", o.eta_l);
  if (o.name != "fedavg") o.beta1 = r.number("beta1", o.beta1);
  if (o.name != "fedavg" && o.name != "fedavgm") {
    o.beta2 = r.number("beta2", o.beta2);
    o.tau = r.number("tau", o.tau);
  }
  o.validate();
  return o;
}

}  // namespace

void ServerOptimizerOptions::validate() const {
  ruleOf(name);
  auto bad = [&](const char* what, double v) {
    STARLING_THROW(ConfigError, "server optimizer '", name, "': ", what, ", got ", v);
  };
  if (!(std::isfinite(eta) && eta > 0)) bad("eta must be finite and > 0", eta);
  if (!(std::isfinite(eta_l) && eta_l > 0)) bad("eta_l must be finite and > 0", eta_l);
  if (!(beta1 >= 0 && beta1 < 1)) bad("beta1 must be in [0, 1)", beta1);
  if (!(beta2 >= 0 && beta2 < 1)) bad("beta2 must be in [0, 1)", beta2);
  if (!(std::isfinite(tau) && tau > 0)) bad("tau must be finite and > 0", tau);
}

std::string ServerOptimizerOptions::spec() const {
  std::ostringstream os;
  os << name << ":eta=" << eta << ",eta_l=" << eta_l << ",beta1=" << beta1 << ",beta2=" << beta2
     << ",tau=" << tau;
  return os.str();
}

ServerOptimizer::ServerOptimizer(ServerOptimizerOptions o, size_t numel)
    : opt_(std::move(o)), numel_(numel) {
  opt_.validate();
}

void ServerOptimizer::step(std::span<float> model, std::span<const float> delta) {
  STARLING_CHECK_ARG(model.size() == numel_ && delta.size() == numel_,
                     "server optimizer: model has ", model.size(), " and delta ", delta.size(),
                     " floats, expected ", numel_);
  if (!allFinite(delta))
    for (size_t i = 0; i < delta.size(); ++i)
      STARLING_CHECK_ARG(std::isfinite(delta[i]), "server optimizer: delta value ", i,
                         " is not finite; round refused");
  apply(model, delta);
  ++steps_;
}

void ServerOptimizer::saveState(ByteWriter& w) const {
  w.u32(kMagic);
  w.u32(kStateVersion);
  w.str(opt_.name);
  w.u64(numel_);
  w.u64(steps_);
  w.floats(m_);
  w.floats(v_);
}

void ServerOptimizer::loadState(ByteReader& r) {
  if (r.u32() != kMagic) r.fail("bad magic (not a server optimizer state)");
  const uint32_t version = r.u32();
  if (version != kStateVersion)
    r.fail("version ", version, " not supported (this build reads ", kStateVersion, ")");
  const std::string name = r.str(64);
  if (name != opt_.name) r.fail("state is for '", name, "', this optimizer is '", opt_.name, "'");
  const uint64_t numel = r.u64();
  if (numel != numel_) r.fail("state is for ", numel, " parameters, not ", numel_);
  const uint64_t steps = r.u64();
  std::vector<float> m, v;
  r.floats(m);
  if (m.size() != m_.size()) r.fail("momentum has ", m.size(), " values, expected ", m_.size());
  r.floats(v);
  if (v.size() != v_.size())
    r.fail("second moment has ", v.size(), " values, expected ", v_.size());
  // A state no step could have produced (a corrupt or edited file) would make the model
  // non-finite at the next step: refused here. Every rule keeps v >= 0 (it starts at tau^2).
  for (float x : m)
    if (!std::isfinite(x)) r.fail("momentum holds a non-finite value");
  for (float x : v)
    if (!(std::isfinite(x) && x >= 0.0f))
      r.fail("second moment holds a negative or non-finite value (", x, ")");
  steps_ = steps;
  m_.swap(m);
  v_.swap(v);
}

const ServerOptimizerRegistry& serverOptimizers() {
  auto entry = [](const char* name, const char* summary, const char* options) {
    return ServerOptimizerRegistry::Entry{
        name, summary, options,
        [n = std::string(name)](OptionReader& r, size_t numel) -> std::unique_ptr<ServerOptimizer> {
          return std::make_unique<Optimizer>(readOptions(r, n), numel);
        }};
  };
  static const ServerOptimizerRegistry kRegistry(
      "server optimizer",
      {
          entry("fedavg", "x += eta * delta (eta = 1: plain FedAvg)", "eta=1, eta_l=0.1"),
          entry("fedavgm", "server momentum: m = beta1 m + delta; x += eta m",
                "eta=1, beta1=0.9, eta_l=0.1"),
          entry("fedadagrad", "adaptive (Reddi et al.): v += delta^2",
                "eta=1, beta1=0.9, beta2=0.99, tau=1e-3, eta_l=0.1"),
          entry("fedadam", "adaptive (Reddi et al.): v = beta2 v + (1-beta2) delta^2",
                "eta=1, beta1=0.9, beta2=0.99, tau=1e-3, eta_l=0.1"),
          entry("fedyogi", "adaptive (Reddi et al.): v -= (1-beta2) delta^2 sign(v - delta^2)",
                "eta=1, beta1=0.9, beta2=0.99, tau=1e-3, eta_l=0.1"),
      });
  return kRegistry;
}

std::unique_ptr<ServerOptimizer> makeServerOptimizer(const ServerOptimizerOptions& o,
                                                     size_t numel) {
  return std::make_unique<Optimizer>(o, numel);
}

std::unique_ptr<ServerOptimizer> makeServerOptimizer(std::string_view spec, size_t numel) {
  return serverOptimizers().make(spec, numel);
}

}  // namespace starling::aggregation
