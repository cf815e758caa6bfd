#include "transport/context.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <zmq_addon.hpp>

#include "core/error.h"
#include "transport/context_impl.h"
#include "transport/keys.h"

namespace starling::transport {

namespace {
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
constexpr const char* kStopEndpoint = "inproc://starling.zap.stop";  // inproc names are per context
}  // namespace

Context::Context(int io_threads) : impl_(std::make_unique<Impl>(io_threads)) {}

Context::~Context() {
  if (const int n = impl_->live_sockets.load(); n != 0) {
    std::fprintf(
        stderr,
        "starling::transport::Context destroyed while %d of its sockets are open: destroy sockets "
        "before their Context (ZeroMQ would hang here)\n",
        n);
    std::abort();
  }
  impl_->stopZap();
}

uint64_t Context::zapRefused() const { return impl_->refused.load(); }
uint64_t Context::zapAdmitted() const { return impl_->admitted.load(); }

bool Context::waitZap(const std::function<bool(uint64_t admitted, uint64_t refused)>& pred,
                      std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(impl_->zap_mu);
  return impl_->zap_cv.wait_for(
      lock, timeout, [&] { return pred(impl_->admitted.load(), impl_->refused.load()); });
}

std::string Context::Impl::registerDomain(std::shared_ptr<const AllowList> allow) {
  STARLING_ENFORCE(allow != nullptr);
  std::lock_guard lock(mu_);
  if (!zap_.joinable()) {
    // Shared with the thread: set_value() may still touch the shared state after get() returned.
    auto bound = std::make_shared<std::promise<void>>();
    auto ready = bound->get_future();
    zap_ = std::thread([this, bound] { zapLoop(bound.get()); });
    try {
      ready.get();  // the REP socket is bound (or binding failed) before any CURVE socket binds
    } catch (...) {
      zap_.join();
      throw;
    }
    stop_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::pair);
    stop_->set(zmq::sockopt::linger, 0);
    stop_->connect(kStopEndpoint);
  }
  std::string domain = "starling." + std::to_string(++next_domain_);
  domains_.emplace(domain, std::move(allow));
  return domain;
}

void Context::Impl::unregisterDomain(const std::string& domain) {
  std::lock_guard lock(mu_);
  domains_.erase(domain);
  refusals_.erase(domain);
  const std::string prefix = domain + '\n';
  for (auto it = handshakes_.lower_bound(prefix);
       it != handshakes_.end() && it->first.rfind(prefix, 0) == 0;)
    it = handshakes_.erase(it);
}

void Context::Impl::replaceDomain(const std::string& domain,
                                  std::shared_ptr<const AllowList> allow) {
  STARLING_ENFORCE(allow != nullptr);
  std::lock_guard lock(mu_);
  const auto it = domains_.find(domain);
  STARLING_ENFORCE(it != domains_.end(), "no ZAP domain ", domain);
  it->second = std::move(allow);
}

std::shared_ptr<const AllowList> Context::Impl::lookup(const std::string& domain) {
  std::lock_guard lock(mu_);
  const auto it = domains_.find(domain);
  return it == domains_.end() ? nullptr : it->second;
}

void Context::Impl::stopZap() {
  if (!zap_.joinable()) return;
  stop_->send(zmq::str_buffer("stop"),
              zmq::send_flags::none);  // PAIR is connected: queued, never lost
  zap_.join();
  stop_.reset();
}

bool Context::Impl::takeHandshake(const std::string& domain, std::string_view key) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  Bucket& b = handshakes_[domain + '\n' + std::string(key)];
  if (b.last == std::chrono::steady_clock::time_point{})
    b.tokens = kHandshakeBurst;
  else
    b.tokens = std::min(
        kHandshakeBurst,
        b.tokens + kHandshakesPerSecond * std::chrono::duration<double>(now - b.last).count());
  b.last = now;
  if (b.tokens < 1.0) return false;
  b.tokens -= 1.0;
  return true;
}

void Context::Impl::recordRefusal(const std::string& domain, Context::Refusal r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!domains_.count(domain)) return;  // nobody will ever take it
  Refusals& q = refusals_[domain];
  if (q.kept.size() < kMaxRefusals)
    q.kept.push_back(std::move(r));
  else
    ++q.dropped;
}

std::vector<Context::Refusal> Context::Impl::takeRefusals(const std::string& domain,
                                                          uint64_t* dropped) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = refusals_.find(domain);
  if (dropped) *dropped = it == refusals_.end() ? 0 : it->second.dropped;
  if (it == refusals_.end()) return {};
  std::vector<Context::Refusal> out = std::move(it->second.kept);
  refusals_.erase(it);
  return out;
}

// Owns the REP socket at kZapEndpoint and a PAIR at kStopEndpoint. Any exception while handling
// one request is answered with status 500 and the loop goes on: if this thread ended, libzmq
// would admit every client.
void Context::Impl::zapLoop(std::promise<void>* bound) {
  std::optional<zmq::socket_t> rep, stop;
  try {
    rep.emplace(ctx, zmq::socket_type::rep);
    rep->set(zmq::sockopt::linger, 0);
    rep->bind(kZapEndpoint);
    stop.emplace(ctx, zmq::socket_type::pair);
    stop->set(zmq::sockopt::linger, 0);
    stop->bind(kStopEndpoint);
  } catch (const zmq::error_t& e) {
    bound->set_exception(
        std::make_exception_ptr(IoError(std::string("cannot bind the ZAP handler: ") + e.what())));
    return;
  }
  bound->set_value();
  std::vector<zmq::pollitem_t> items = {{rep->handle(), 0, ZMQ_POLLIN, 0},
                                        {stop->handle(), 0, ZMQ_POLLIN, 0}};
  for (;;) {
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(-1));
    } catch (const zmq::error_t&) {
      continue;  // EINTR
    }
    if (items[1].revents & ZMQ_POLLIN) break;
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    std::vector<zmq::message_t> req;
    std::string request_id, status = "400", text = "not allowed", user;
    std::string domain;
    Context::Refusal why{"", "", "a malformed ZAP request"};
    try {
      (void)zmq::recv_multipart(*rep, std::back_inserter(req));
      // version, request id, domain, address, routing id, mechanism, credentials...
      if (req.size() >= 2) request_id = req[1].to_string();
      if (req.size() >= 4) {
        domain = req[2].to_string();
        why.address = req[3].to_string();
      }
      if (req.size() == 7 && req[0].to_string_view() == "1.0" &&
          req[5].to_string_view() == "CURVE") {
        static constexpr char kHex[] = "0123456789abcdef";
        const auto key = req[6].to_string_view();
        for (size_t i = 0; i < key.size() && i < 8; ++i) {
          why.key += kHex[static_cast<unsigned char>(key[i]) >> 4];
          why.key += kHex[static_cast<unsigned char>(key[i]) & 15];
        }
        const auto allow = lookup(domain);
        const auto id = allow ? allow->find(key) : std::nullopt;
        why.reason =
            allow ? "its CURVE public key is not on the allow-list" : "an unknown ZAP domain";
        if (id && !takeHandshake(domain, key)) {
          // 300, ZAP's temporary error: the key is admitted, only too often at once (a client
          // tells this from a refusal of its key, 400, and tries again).
          status = "300";
          text = "too many handshakes";
          why.reason = "too many handshakes of one key (more than 20 at once or 5 a second)";
        } else if (id) {
          status = "200";
          text = "OK";
          user = std::to_string(*id);
        }
      } else if (req.size() == 7) {
        why.reason = "not a CURVE handshake (" + req[5].to_string() + ")";
      }
    } catch (...) {
      status = "500";
      text = "internal error";
      why.reason = "an internal error of the ZAP handler";
    }
    {
      std::lock_guard<std::mutex> lock(zap_mu);  // a waiter cannot miss it between check and wait
      (status == "200" ? admitted : refused).fetch_add(1);
    }
    zap_cv.notify_all();
    if (status != "200" && !domain.empty()) recordRefusal(domain, std::move(why));
    try {
      std::vector<zmq::const_buffer> reply = {zmq::str_buffer("1.0"), zmq::buffer(request_id),
                                              zmq::buffer(status),    zmq::buffer(text),
                                              zmq::buffer(user),      zmq::const_buffer()};
      zmq::send_multipart(*rep, reply);
    } catch (...) {
      // A REP socket that failed to reply is stuck; nothing sane is left but to keep polling.
    }
  }
}

}  // namespace starling::transport
