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
  STARLING_THROW(ConfigError, "unknown server optimizer '", name,
                 "' (registered: fedavg, fedavgm, fedadagrad, fedadam, fedyogi)");
}

class Optimizer final : public ServerOptimizer {
 public:
  Optimizer(ServerOptimizerOptions o, size_t numel) : ServerOptimizer(std::move(o), numel), rule_(ruleOf(opt_.name)) {
    if (rule_ != Rule::kAvg) m_.assign(numel, 0.0f);
    if (rule_ != Rule::kAvg && rule_ != Rule::kAvgM) v_.assign(numel, static_cast<float>(opt_.tau * opt_.tau));
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
        case Rule::kAdagrad: v_[i] += d2; break;
        case Rule::kAdam: v_[i] = b2 * v_[i] + (1.0f - b2) * d2; break;
        case Rule::kYogi: {
          const float diff = v_[i] - d2;
          const float sgn = static_cast<float>((diff > 0.0f) - (diff < 0.0f));
          v_[i] -= (1.0f - b2) * d2 * sgn;
          break;
        }
        default: break;
      }
      x[i] += eta * m_[i] / (std::sqrt(v_[i]) + tau);
    }
  }

 private:
  Rule rule_;
};

constexpr uint32_t kMagic = 0x5354534f;  // "OSTS"

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

ServerOptimizerOptions ServerOptimizerOptions::parse(std::string_view text) {
  const Spec spec = Spec::parse(text, "server optimizer");
  ServerOptimizerOptions o;
  o.name = spec.name;
  ruleOf(o.name);
  OptionReader r(spec, "server optimizer");
  o.eta = r.number("eta", o.eta);
  o.eta_l = r.number("eta_l", o.eta_l);
  o.beta1 = r.number("beta1", o.beta1);
  o.beta2 = r.number("beta2", o.beta2);
  o.tau = r.number("tau", o.tau);
  r.finish("eta, eta_l, beta1, beta2, tau");
  o.validate();
  return o;
}

std::string ServerOptimizerOptions::spec() const {
  std::ostringstream os;
  os << name << ":eta=" << eta << ",eta_l=" << eta_l << ",beta1=" << beta1 << ",beta2=" << beta2 << ",tau=" << tau;
  return os.str();
}

ServerOptimizer::ServerOptimizer(ServerOptimizerOptions o, size_t numel) : opt_(std::move(o)), numel_(numel) {
  opt_.validate();
}

void ServerOptimizer::step(std::span<float> model, std::span<const float> delta) {
  STARLING_CHECK_ARG(model.size() == numel_ && delta.size() == numel_, "server optimizer: model has ", model.size(),
                     " and delta ", delta.size(), " floats, expected ", numel_);
  if (!allFinite(delta))
    for (size_t i = 0; i < delta.size(); ++i)
      STARLING_CHECK_ARG(std::isfinite(delta[i]), "server optimizer: delta value ", i, " is not finite; round refused");
  apply(model, delta);
  ++steps_;
}

std::vector<uint8_t> ServerOptimizer::saveState() const {
  std::vector<uint8_t> out;
  auto put = [&](const void* p, size_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    if (n) std::memcpy(out.data() + at, p, n);
  };
  const uint32_t magic = kMagic;
  const uint64_t name_len = opt_.name.size(), numel = numel_, nm = m_.size(), nv = v_.size();
  put(&magic, 4);
  put(&name_len, 8);
  put(opt_.name.data(), name_len);
  put(&numel, 8);
  put(&steps_, 8);
  put(&nm, 8);
  put(m_.data(), nm * 4);
  put(&nv, 8);
  put(v_.data(), nv * 4);
  return out;
}

void ServerOptimizer::loadState(std::span<const uint8_t> b) {
  size_t pos = 0;
  auto get = [&](void* p, size_t n) {
    if (n > b.size() - pos) STARLING_THROW(IoError, "server optimizer state: truncated at byte ", pos);
    if (n) std::memcpy(p, b.data() + pos, n);
    pos += n;
  };
  uint32_t magic = 0;
  uint64_t name_len = 0, numel = 0, steps = 0, nm = 0, nv = 0;
  get(&magic, 4);
  if (magic != kMagic) STARLING_THROW(IoError, "server optimizer state: bad magic");
  get(&name_len, 8);
  if (name_len > 64) STARLING_THROW(IoError, "server optimizer state: name length ", name_len);
  std::string name(name_len, '\0');
  get(name.data(), name_len);
  if (name != opt_.name)
    STARLING_THROW(IoError, "server optimizer state is for '", name, "', this optimizer is '", opt_.name, "'");
  get(&numel, 8);
  if (numel != numel_) STARLING_THROW(IoError, "server optimizer state is for ", numel, " parameters, not ", numel_);
  get(&steps, 8);
  get(&nm, 8);
  if (nm != m_.size()) STARLING_THROW(IoError, "server optimizer state: momentum has ", nm, " values");
  std::vector<float> m(nm), v;
  get(m.data(), nm * 4);
  get(&nv, 8);
  if (nv != v_.size()) STARLING_THROW(IoError, "server optimizer state: second moment has ", nv, " values");
  v.resize(nv);
  get(v.data(), nv * 4);
  if (pos != b.size()) STARLING_THROW(IoError, "server optimizer state: trailing bytes");
  steps_ = steps;
  m_ = std::move(m);
  v_ = std::move(v);
}

std::unique_ptr<ServerOptimizer> makeServerOptimizer(const ServerOptimizerOptions& o, size_t numel) {
  return std::make_unique<Optimizer>(o, numel);
}

std::unique_ptr<ServerOptimizer> makeServerOptimizer(std::string_view spec, size_t numel) {
  return makeServerOptimizer(ServerOptimizerOptions::parse(spec), numel);
}

}  // namespace starling::aggregation
