#pragma once
// Internal to transport/: what a Context holds (see context.h for the contract).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "transport/context.h"

namespace starling::transport {

struct Context::Impl {
  explicit Impl(int io_threads) : ctx(io_threads) {}

  // Starts the ZAP thread (bound before this returns) if it is not running, and registers `allow`
  // under a fresh ZAP domain, which it returns. Thread-safe.
  std::string registerDomain(std::shared_ptr<const AllowList> allow);
  void unregisterDomain(const std::string& domain);
  // Puts `allow` in place of `domain`'s list: the next handshake is judged by it. Thread-safe.
  void replaceDomain(const std::string& domain, std::shared_ptr<const AllowList> allow);
  // The list of a domain, or null. Thread-safe (the ZAP thread calls it).
  std::shared_ptr<const AllowList> lookup(const std::string& domain);
  void stopZap();
  // The refusals recorded for `domain` since the last call, oldest first (at most kMaxRefusals
  // are kept per domain between calls; *dropped gets how many more there were). Thread-safe.
  std::vector<Context::Refusal> takeRefusals(const std::string& domain, uint64_t* dropped);
  static constexpr size_t kMaxRefusals = 64;
  static constexpr double kHandshakeBurst = 20, kHandshakesPerSecond = 5;

  zmq::context_t ctx;
  std::atomic<uint64_t> refused{0}, admitted{0};
  // Notified after every ZAP decision (Context::waitZap).
  std::mutex zap_mu;
  std::condition_variable zap_cv;
  std::atomic<int> live_sockets{0};  // ServerSocket/ClientSocket objects not yet destroyed

 private:
  void zapLoop(std::promise<void>* bound);
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const AllowList>> domains_;  // guarded by mu_
  struct Refusals {
    std::vector<Context::Refusal> kept;
    uint64_t dropped = 0;
  };
  std::map<std::string, Refusals> refusals_;  // guarded by mu_
  // Handshakes of each admitted key: a token bucket (kHandshakeBurst, refilled
  // kHandshakesPerSecond) so that no key can probe routing ids by reconnecting fast (socket.h).
  // Guarded by mu_; one entry per (domain, admitted key), dropped with the domain.
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point last{};
  };
  std::map<std::string, Bucket> handshakes_;
  bool takeHandshake(const std::string& domain, std::string_view key);
  void recordRefusal(const std::string& domain, Context::Refusal r);
  uint64_t next_domain_ = 0;  // guarded by mu_
  std::thread zap_;           // started under mu_
  std::unique_ptr<zmq::socket_t>
      stop_;  // PAIR to the ZAP thread; used under mu_ / in the destructor
};

}  // namespace starling::transport
