#pragma once
// Server optimizers (Reddi et al., "Adaptive Federated Optimization", ICLR 2021). Each round the
// server applies the aggregated pseudo-gradient delta = weighted mean of (client model - global
// model) to the global model x. With m_{-1} = 0 and v_{-1} = tau^2:
//   fedavg     x += eta * delta                           (eta = 1: plain FedAvg)
//   fedavgm    m = beta1 * m + delta;  x += eta * m        (Hsu et al. 2019, server momentum)
//   fedadagrad m = beta1 m + (1-beta1) delta;  v = v + delta^2;                x += eta m /
//   (sqrt(v) + tau) fedadam    m = beta1 m + (1-beta1) delta;  v = beta2 v + (1-beta2) delta^2; x
//   += eta m / (sqrt(v) + tau) fedyogi    m = beta1 m + (1-beta1) delta;  v = v - (1-beta2) delta^2
//   sign(v - delta^2); x += ...
// No bias correction, as in the paper. eta_l (the clients' learning rate) is carried for the
// round configuration the server sends to clients; the server step does not use it.
// State (m, v, step count) is serializable for checkpoints.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/bytes.h"
#include "core/registry.h"

namespace starling::aggregation {

struct ServerOptimizerOptions {
  std::string name = "fedavg";
  double eta = 1.0;    // server learning rate (Reddi's defaults for the adaptive ones: 1e-2..1)
  double eta_l = 0.1;  // client learning rate, forwarded to clients
  double beta1 = 0.9;  // momentum (fedavgm uses it as the momentum factor)
  double beta2 = 0.99;
  double tau = 1e-3;  // adaptivity; v starts at tau^2
  void validate() const;
  std::string spec() const;
};

class ServerOptimizer {
 public:
  virtual ~ServerOptimizer() = default;
  const ServerOptimizerOptions& options() const { return opt_; }
  uint64_t steps() const { return steps_; }

  // x += update(delta). Throws InvalidArgument on a size mismatch or a non-finite delta (the
  // model is untouched then).
  void step(std::span<float> model, std::span<const float> delta);

  // Little-endian, versioned (core/bytes.h), for checkpoints.
  void saveState(ByteWriter& w) const;
  // Throws IoError on corrupt bytes or a state from another optimizer or model size; on a throw
  // the optimizer is unchanged.
  void loadState(ByteReader& r);

 protected:
  ServerOptimizer(ServerOptimizerOptions o, size_t numel);
  virtual void apply(std::span<float> model, std::span<const float> delta) = 0;
  ServerOptimizerOptions opt_;
  size_t numel_;
  uint64_t steps_ = 0;
  std::vector<float> m_, v_;  // empty when the rule does not use them
};

// "fedavg", "fedadam:eta=0.01,tau=0.001", ... (registry: names and options for --help).
using ServerOptimizerRegistry = Registry<ServerOptimizer, size_t>;
const ServerOptimizerRegistry& serverOptimizers();
std::unique_ptr<ServerOptimizer> makeServerOptimizer(const ServerOptimizerOptions& o, size_t numel);
std::unique_ptr<ServerOptimizer> makeServerOptimizer(std::string_view spec, size_t numel);

}  // namespace starling::aggregation
