#include "server/zmq_fleet.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <random>

#include "core/error.h"
#include "core/log_fields.h"
#include "server/secure_relay.h"

namespace starling::server {
namespace ag = starling::aggregation;
namespace pr = starling::protocol;
using Steady = std::chrono::steady_clock;  // not the injectable starling::Clock
using std::chrono::milliseconds;

struct ZmqFleet::Phase {
  const PhaseTask* task = nullptr;
  ag::PhaseAggregator* agg = nullptr;
  PhaseReport* report = nullptr;
  EvalReport* eval = nullptr;
  size_t accepted = 0;
  std::unordered_map<uint64_t, std::vector<uint8_t>>
      encoded;                    // task bytes by the version a client holds
  uint64_t encoded_for = 0;       // the task version `encoded` holds (asynchronous rounds move it)
  AsyncIntake* async = nullptr;   // asynchronous rounds: tasks stay open across server steps
  bool event = false;             // asynchronous rounds: an answer or a failure was taken
  SecureSteps* secure = nullptr;  // secure aggregation: the round whose step this is
  SecureStage stage = SecureStage::kAdvertise;
  // secureRoster(): the aggregators' answers, and the relay's nonce they must carry.
  std::map<uint64_t, std::vector<uint64_t>>* roster = nullptr;
  uint64_t roster_round = 0, roster_nonce = 0;
  bool closing = false;  // past its deadline, taking what is queued (takeQueued)
  // For progress(): tasks sent, answers wanted, and the deadline.
  size_t sent = 0, target = 0;
  std::chrono::steady_clock::time_point deadline{};
  // For phaseTimes(): when it began (real time).
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

// Ends a phase or an evaluation however it leaves (a return, server::Stopped): no phase, and every
// task still open closed (an answer to it is late).
struct ZmqFleet::PhaseReset {
  ZmqFleet* f;
  ~PhaseReset() {
    if (const Phase* ph = f->phase_; ph && !ph->async) {
      PhaseTime t;
      t.seq = ++f->phase_seq_;
      t.step = ph->eval ? "evaluate" : ph->task ? "fit" : ph->roster ? "roster" : "secure";
      t.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - ph->started).count();
      f->phase_times_.push_back(t);
      if (f->phase_times_.size() > kPhaseTimesKept) f->phase_times_.pop_front();
    }
    f->phase_ = nullptr;
    for (const auto& [id, p] : f->pending_) f->expired_[id].add(p.nonce);
    f->pending_.clear();
  }
};

namespace {
uint64_t randomNonZero(std::mt19937_64& rng) {
  uint64_t v = 0;
  while (v == 0) v = rng();
  return v;
}
std::mt19937_64 seededRng() {
  std::random_device rd;
  std::seed_seq seq{rd(), rd(), rd(), rd()};
  return std::mt19937_64(seq);
}
}  // namespace

void FleetConfig::validate() const {
  security.validate(/*server_side=*/true);
  limits.validate();
  if (heartbeat_ms < 10)
    STARLING_THROW(ConfigError, "heartbeat_ms must be at least 10, got ", heartbeat_ms);
  if (silence_ms <= heartbeat_ms)
    STARLING_THROW(ConfigError, "silence_ms (", silence_ms, ") must exceed heartbeat_ms (",
                   heartbeat_ms, ")");
  if (max_examples == 0) STARLING_THROW(ConfigError, "max_examples must be positive");
  if (clock == nullptr) STARLING_THROW(ConfigError, "the fleet's clock is null");
  if (downlink_copies == 0) STARLING_THROW(ConfigError, "downlink.copies must be positive");
  if (!(downlink_density > 0.0 && downlink_density <= 1.0))
    STARLING_THROW(ConfigError, "downlink.density must be in (0, 1], got ", downlink_density);
}

ZmqFleet::ZmqFleet(transport::Context& ctx, FleetConfig config,
                   std::shared_ptr<const ParamLayout> layout, std::shared_ptr<spdlog::logger> log)
    : config_((config.validate(), std::move(config))),
      layout_(std::move(layout)),
      log_(log ? std::move(log) : spdlog::default_logger()),
      socket_(ctx, config_.bind, config_.security, config_.limits),
      decoder_(*layout_, pr::DecodeLimits{config_.limits.max_message_bytes, 32, 64}) {
  auto rng = seededRng();
  session_ = randomNonZero(rng);
}

ZmqFleet::~ZmqFleet() = default;

std::string ZmqFleet::endpoint() const { return socket_.endpoint(); }

void ZmqFleet::setAllowList(std::shared_ptr<const transport::AllowList> allow) {
  socket_.setAllowList(std::move(allow));
}

bool ZmqFleet::revoke(uint64_t id) {
  if (!socket_.secure())
    STARLING_THROW(ConfigError,
                   "revoking a client needs CURVE: an insecure server cannot tell who sends");
  if (!revoked_.insert(id).second) return false;
  // Told at once why: an honest client registers again, is refused for good (kRevoked,
  // RegistrationRefused), stops and closes its connection. An answer already on its way to the
  // task that fails now is refused when it comes.
  pr::RejectMsg m;
  m.kind = pr::RejectKind::kNotRegistered;
  m.code = static_cast<uint32_t>(Errc::kRevoked);
  m.message = "client " + std::to_string(id) + " was revoked by the federation's operator";
  if (forget(id, pr::encode(m))) ++revoked_in_flight_;
  // Its connections closed kRevokeGrace later, whether or not it listened (the owner took its key
  // off the ZAP handler's list first, so it cannot handshake again).
  cut_due_[id] = config_.clock->now() + kRevokeGrace;
  return true;
}

ZmqFleet::Tally& ZmqFleet::tally(uint64_t id) {
  if (const auto it = tallies_.find(id); it != tallies_.end()) return it->second;
  if (tallies_.size() >= kMaxTallies) {
    // Full: the 1% of peers not registered now that were seen longest ago go at once (one scan
    // per thousand new peers). A registered peer's tally is kept; while all are, a new peer is not
    // tracked (its counts go to a scratch tally, shown nowhere).
    std::vector<std::pair<std::chrono::steady_clock::time_point, uint64_t>> gone;
    for (const auto& [other, t] : tallies_)
      if (!clients_.count(other)) gone.emplace_back(t.last_seen, other);
    if (gone.empty()) {
      untracked_ = Tally{};
      return untracked_;
    }
    const size_t n = std::min(gone.size(), std::max<size_t>(1, kMaxTallies / 100));
    std::nth_element(gone.begin(), gone.begin() + static_cast<std::ptrdiff_t>(n - 1), gone.end());
    for (size_t i = 0; i < n; ++i) tallies_.erase(gone[i].second);
  }
  return tallies_[id];
}

std::vector<ZmqFleet::PeerView> ZmqFleet::peers() const {
  const auto now = config_.clock->now();
  const auto cutoff = now - milliseconds(config_.silence_ms);
  std::vector<PeerView> out;
  out.reserve(tallies_.size());
  for (const auto& [id, t] : tallies_) {
    PeerView v;
    v.id = id;
    v.aggregator = t.aggregator;
    const auto c = clients_.find(id);
    v.registered = c != clients_.end();
    v.online = v.registered && c->second.last_seen >= cutoff;
    v.in_round = pending_.count(id) != 0;
    v.revoked = revoked_.count(id) != 0;
    v.seen_seconds_ago = std::max(0.0, std::chrono::duration<double>(now - t.last_seen).count());
    v.updates = t.updates;
    v.refused = t.refused;
    v.last_refusal = t.last_refusal;
    v.subtree = t.subtree;
    if (t.subtree)
      v.subtree_seconds_ago =
          std::max(0.0, std::chrono::duration<double>(now - t.subtree_at).count());
    out.push_back(std::move(v));
  }
  std::sort(out.begin(), out.end(),
            [](const PeerView& a, const PeerView& b) { return a.id < b.id; });
  return out;
}

std::vector<pr::SubtreePeer> ZmqFleet::subtree() const {
  std::vector<PeerView> views = peers();  // by id
  std::stable_sort(views.begin(), views.end(), [](const PeerView& a, const PeerView& b) {
    return std::pair(a.online, a.registered) > std::pair(b.online, b.registered);
  });
  std::vector<pr::SubtreePeer> out;
  for (const PeerView& v : views) {
    if (out.size() == pr::kMaxSubtree) break;
    if (v.aggregator || v.revoked) continue;
    pr::SubtreePeer p;
    p.id = v.id;
    p.online = v.online;
    p.in_round = v.in_round;
    p.seen_ms = static_cast<uint32_t>(std::min(v.seen_seconds_ago * 1000.0, 4.0e9));
    p.updates = v.updates;
    p.refused = v.refused;
    p.last_refusal = pr::refusalField(v.last_refusal);
    out.push_back(p);
  }
  return out;
}

ZmqFleet::Progress ZmqFleet::progress() const {
  Progress p;
  p.open = pending_.size();
  if (!phase_) return p;
  if (phase_->async) {
    p.step = "async";
    p.round = phase_->encoded_for;
    return p;
  }
  p.step = phase_->eval ? "evaluate" : phase_->task ? "fit" : "secure";
  if (phase_->task) {
    p.round = phase_->task->header.round;
    p.phase = phase_->task->header.phase;
  } else if (phase_->secure) {
    p.round = phase_->secure->round();
  } else if (phase_->roster) {
    p.round = phase_->roster_round;
  }
  p.sent = phase_->sent;
  p.accepted = phase_->accepted;
  p.target = phase_->target;
  p.seconds_left =
      std::max(0.0, std::chrono::duration<double>(phase_->deadline - config_.clock->now()).count());
  return p;
}

bool ZmqFleet::forget(uint64_t id, const std::vector<uint8_t>& tell) {
  bool had_task = false;
  if (auto pend = pending_.find(id); pend != pending_.end()) {
    had_task = true;
    failPending(pend);
  }
  if (auto c = clients_.find(id); c != clients_.end()) {
    if (!tell.empty()) socket_.send(c->second.routing, tell);
    by_routing_.erase(c->second.routing);
    clients_.erase(c);
  }
  return had_task;
}

size_t ZmqFleet::replacedKey(uint64_t id) {
  (void)forget(id);
  const size_t n = socket_.cutConnections(id);
  log_->warn("client {}'s key was replaced: {} connection{} of the old key closed", id, n,
             n == 1 ? "" : "s");
  return n;
}

void ZmqFleet::cutRevoked() {
  const auto now = config_.clock->now();
  for (auto it = cut_due_.begin(); it != cut_due_.end();) {
    if (it->second > now) {
      ++it;
      continue;
    }
    const size_t n = socket_.cutConnections(it->first);
    revoked_cut_ += n;
    const ScopedLogFields fields(std::nullopt, it->first, Errc::kRevoked);
    if (n > 0)
      log_->warn("closed {} connection{} of revoked client {} (it did not close {})", n,
                 n == 1 ? "" : "s", it->first, n == 1 ? "it" : "them");
    else
      log_->info("revoked client {} has no connection left open", it->first);
    it = cut_due_.erase(it);
  }
}

size_t ZmqFleet::onlineCount() const {
  const auto cutoff = config_.clock->now() - milliseconds(config_.silence_ms);
  size_t n = 0;
  for (const auto& [id, p] : clients_) n += p.last_seen >= cutoff;
  return n;
}

uint64_t ZmqFleet::refusedTotal() const {
  uint64_t n = 0;
  for (uint64_t c : refused_) n += c;
  return n;
}

std::vector<ClientInfo> ZmqFleet::available() const {
  std::vector<ClientInfo> out;
  const auto cutoff = config_.clock->now() - milliseconds(config_.silence_ms);
  for (const auto& [id, p] : clients_)
    if (p.last_seen >= cutoff) out.push_back(p.info);
  std::sort(out.begin(), out.end(),
            [](const ClientInfo& a, const ClientInfo& b) { return a.id < b.id; });
  return out;
}

namespace {
uint64_t saturatingAdd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }
}  // namespace

uint64_t ZmqFleet::totalExamples() const {
  uint64_t n = 0;
  for (const auto& c : available()) n = saturatingAdd(n, c.num_examples);
  return n;
}

uint64_t ZmqFleet::totalEvalExamples() const {
  uint64_t n = 0;
  for (const auto& c : available()) n = saturatingAdd(n, c.eval_examples);
  return n;
}

void ZmqFleet::refuse(const std::string& routing, Errc code, const std::string& what,
                      uint64_t round, uint64_t nonce, bool registration) {
  ++refused_[static_cast<size_t>(code)];
  {
    // For JSON logs: the code, and the peer when its connection is registered.
    std::optional<uint64_t> peer;
    if (const auto it = by_routing_.find(routing); it != by_routing_.end()) peer = it->second;
    if (peer) {
      Tally& t = tally(*peer);
      ++t.refused;
      t.last_refusal = code;
    }
    const ScopedLogFields fields(std::nullopt, peer, code);
    log_->warn("refused a message: {}", what);
  }
  if (routing.empty()) return;
  pr::RejectMsg m;
  m.kind = registration                   ? pr::RejectKind::kRegistrationRefused
           : code == Errc::kNotRegistered ? pr::RejectKind::kNotRegistered
                                          : pr::RejectKind::kRefused;
  m.code = static_cast<uint32_t>(code);
  m.round = round;
  m.nonce = nonce;
  m.message = what;
  socket_.send(routing, pr::encode(m));
}

ZmqFleet::Peer* ZmqFleet::peerOf(const transport::Received& r) {
  auto it = by_routing_.find(r.peer);
  if (it == by_routing_.end()) return nullptr;
  auto c = clients_.find(it->second);
  if (c == clients_.end() || c->second.routing != r.peer) return nullptr;
  // Under CURVE the connection's key decides who speaks: a peer that took over another's routing
  // id (ROUTER_HANDOVER) with its own key is not that client.
  if (r.authenticated_id && *r.authenticated_id != c->second.info.id) return nullptr;
  return &c->second;
}

std::string ZmqFleet::describePeer(const transport::Received& r) const {
  if (r.authenticated_id) return "client " + std::to_string(*r.authenticated_id) + " (by its key)";
  if (const auto it = by_routing_.find(r.peer); it != by_routing_.end())
    return "client " + std::to_string(it->second);
  return "a connection that has not registered";
}

void ZmqFleet::handle(const transport::Received& r) {
  if (r.error) {
    // The transport refused a message before it was whole. A peer that is only too early (the
    // reassembly budget is full) is told to send again; the others are counted and logged.
    const bool busy = r.error->code() == Errc::kBusy;
    if (busy) {
      ++refused_[static_cast<size_t>(Errc::kBusy)];
      pr::RejectMsg m;
      m.kind = pr::RejectKind::kBusy;
      m.code = static_cast<uint32_t>(Errc::kBusy);
      m.message = "the server's upload memory is full: send again shortly";
      socket_.send(r.peer, pr::encode(m));
      return;
    }
    // Every refusal is answered (docs/protocol.md) but a rate limit's: answering a flood would
    // amplify it. The log names the peer (a rate limit's line once did not say whose).
    const bool rate = r.error->code() == Errc::kRateLimited;
    refuse(rate ? std::string() : r.peer, r.error->code(),
           "from " + describePeer(r) + ": " + std::string(r.error->what()));
    return;
  }
  const auto bytes = r.bytes();
  const auto kind = pr::peekKind(bytes);
  // A revoked key: nothing of it is read. Its client is told it is not registered, registers
  // again, and that Register is refused for good (RegistrationRefused), on which it stops. Logged
  // once a second per client at most (a revoked client may not stop).
  if (r.authenticated_id && revoked_.count(*r.authenticated_id)) {
    const uint64_t id = *r.authenticated_id;
    ++refused_[static_cast<size_t>(Errc::kRevoked)];
    if (auto t = tallies_.find(id); t != tallies_.end()) {
      ++t->second.refused;
      t->second.last_refusal = Errc::kRevoked;
    }
    const auto now = config_.clock->now();
    if (auto& last = revoked_said_[id]; now - last >= std::chrono::seconds(1)) {
      last = now;
      const ScopedLogFields fields(std::nullopt, id, Errc::kRevoked);
      log_->warn("refused a message: client {} was revoked by an operator", id);
      // Past its grace, a connection it still speaks on (one it kept silent until now, or made
      // before its key came off the list) is closed too, once a second at most.
      if (!cut_due_.count(id))
        if (const size_t n = socket_.cutConnections(id); n > 0) {
          revoked_cut_ += n;
          log_->warn("closed {} more connection{} of revoked client {}", n, n == 1 ? "" : "s", id);
        }
    }
    pr::RejectMsg m;
    m.kind = kind == pr::MessageKind::kRegister ? pr::RejectKind::kRegistrationRefused
                                                : pr::RejectKind::kNotRegistered;
    m.code = static_cast<uint32_t>(Errc::kRevoked);
    m.message = "client " + std::to_string(id) + " was revoked by the federation's operator";
    socket_.send(r.peer, pr::encode(m));
    return;
  }
  if (!kind) {
    refuse(r.peer, Errc::kMalformed,
           "not a Starling message (" + std::to_string(bytes.size()) + " bytes)");
    return;
  }
  if (*kind == pr::MessageKind::kRegister) {
    handleRegister(r);
    return;
  }
  Peer* peer = peerOf(r);
  if (!peer) {
    refuse(r.peer, Errc::kNotRegistered,
           std::string(pr::kindName(*kind)) + " from a peer that has not registered");
    return;
  }
  peer->last_seen = config_.clock->now();
  {
    Tally& t = tally(peer->info.id);
    t.last_seen = peer->last_seen;
    t.aggregator = peer->info.role == pr::Role::kAggregator;
  }
  try {
    switch (*kind) {
      case pr::MessageKind::kHeartbeat: {
        // An edge aggregator's clients come with it, for the status page; a client has none to
        // tell (refused before its entries are read).
        const bool aggregator = peer->info.role == pr::Role::kAggregator;
        pr::ControlLimits limits;
        limits.max_subtree = aggregator ? pr::kMaxSubtree : 0;
        auto h = pr::decodeHeartbeat(bytes, limits);
        if (h.client_id != peer->info.id)
          failInput(Errc::kWrongSender, "heartbeat names client ", h.client_id);
        if (h.subtree) {
          Tally& t = tally(peer->info.id);
          if (!t.subtree || peer->last_seen - t.subtree_at >= kSubtreeEvery) {
            t.subtree = std::make_shared<const std::vector<pr::SubtreePeer>>(std::move(*h.subtree));
            t.subtree_at = peer->last_seen;
          }
        }
        socket_.send(peer->routing, pr::encode(pr::HeartbeatMsg{
                                        peer->info.id, session_,
                                        phase_ && phase_->task ? phase_->task->header.round : 0}));
        return;
      }
      case pr::MessageKind::kUpdate:
        handleUpdate(r, *peer, false);
        return;
      case pr::MessageKind::kPartial:
        handleUpdate(r, *peer, true);
        return;
      case pr::MessageKind::kEvaluation:
        handleEvaluation(r, *peer);
        return;
      case pr::MessageKind::kSecAggKeys:
      case pr::MessageKind::kSecAggShares:
      case pr::MessageKind::kSecAggMasked:
      case pr::MessageKind::kSecAggReveal:
      case pr::MessageKind::kSecAggSigned:
        handleSecure(r, *peer, *kind);
        return;
      case pr::MessageKind::kSecAggRelay:
        handleRelay(r, *peer);
        return;
      case pr::MessageKind::kReject:
        handleDecline(r, *peer);
        return;
      default:
        failInput(Errc::kUnexpectedMessage, "a client may not send ", pr::kindName(*kind));
    }
  } catch (const InputError& e) {
    refuse(peer->routing, e.code(), "client " + std::to_string(peer->info.id) + ": " + e.what());
  } catch (const InvalidArgument& e) {
    // What the round cannot take at all (a partial aggregate under a robust rule, ...): refused
    // like any bad input; never let one peer's message end the server.
    refuse(peer->routing, Errc::kUnexpectedMessage,
           "client " + std::to_string(peer->info.id) + ": " + e.what());
  }
}

void ZmqFleet::handleRegister(const transport::Received& r) {
  pr::RegisterMsg m;
  try {
    m = pr::decodeRegister(r.bytes());
    if (m.layout_fingerprint != layout_->fingerprint())
      failInput(Errc::kFingerprintMismatch, "client ", m.client_id,
                " trains another model (layout fingerprint ", hexFingerprint(m.layout_fingerprint),
                ", the server's is ", hexFingerprint(layout_->fingerprint()),
                "): model.spec and the data's shape and classes must be the server's");
    if (r.authenticated_id && *r.authenticated_id != m.client_id)
      failInput(Errc::kWrongSender, "a peer whose key is listed as client ", *r.authenticated_id,
                " registered as client ", m.client_id);
    if (m.num_examples == 0 || m.num_examples > config_.max_examples ||
        m.eval_examples > config_.max_examples)
      failInput(Errc::kBadWeight, "client ", m.client_id, " registers ", m.num_examples,
                " training and ", m.eval_examples, " evaluation examples (1 to ",
                config_.max_examples, " allowed)");
    if (m.role == pr::Role::kAggregator && !config_.aggregator_ids.count(m.client_id))
      failInput(Errc::kWrongSender, "client ", m.client_id,
                " registers as an aggregator but is not listed as one");
    if (m.role == pr::Role::kClient && config_.aggregator_ids.count(m.client_id))
      failInput(Errc::kWrongSender, "aggregator ", m.client_id,
                " registers as a client (it is listed as an aggregator)");
  } catch (const InputError& e) {
    // What registering again cannot change, which the client is told to give up on: a key listed
    // under another id, another model. Not a weight out of bounds (an aggregator's subtree total
    // changes as its clients come and go), nor a malformed Register: ordinary refusals.
    refuse(r.peer, e.code(), std::string("registration refused: ") + e.what(), 0, 0,
           e.code() == Errc::kFingerprintMismatch || e.code() == Errc::kWrongSender);
    return;
  }
  auto [it, fresh] = clients_.try_emplace(m.client_id);
  Peer& p = it->second;
  const bool same_connection = !fresh && p.routing == r.peer;
  if (!fresh && p.routing != r.peer)
    by_routing_.erase(p.routing);  // reconnected under a new routing id
  p.routing = r.peer;
  p.info = ClientInfo{m.client_id, m.role, m.num_examples, m.eval_examples, m.model_version};
  p.info.qsgd_downlink = std::find(m.capabilities.begin(), m.capabilities.end(),
                                   kQsgdDownlinkCapability) != m.capabilities.end();
  p.info.stc_downlink = std::find(m.capabilities.begin(), m.capabilities.end(),
                                  kStcDownlinkCapability) != m.capabilities.end();
  p.info.block_downlink = std::find(m.capabilities.begin(), m.capabilities.end(),
                                    kBlockDownlinkCapability) != m.capabilities.end();
  p.last_seen = config_.clock->now();
  by_routing_[r.peer] = m.client_id;
  Tally& t = tally(m.client_id);
  t.aggregator = m.role == pr::Role::kAggregator;
  t.last_seen = p.last_seen;
  if (!same_connection)
    log_->info("{} {} registered ({} examples{})",
               m.role == pr::Role::kAggregator ? "aggregator" : "client", m.client_id,
               m.num_examples, fresh ? "" : ", again");
  socket_.send(r.peer, pr::encode(pr::WelcomeMsg{m.client_id, session_, config_.heartbeat_ms,
                                                 config_.limits.max_message_bytes,
                                                 config_.limits.chunk_bytes}));
  // A client that restarted in the middle of its task (a new connection), or that could not apply
  // it (it says which version it holds), gets the task again and carries on; a duplicate
  // registration does not. In asynchronous rounds its task is failed instead and a new one, on
  // the current version, follows (the task's version may be gone from the delta history).
  auto pend = pending_.find(m.client_id);
  if (pend == pending_.end() || !phase_ || phase_->closing || pend->second.evaluate) return;
  Pending& q = pend->second;
  if (same_connection && q.sent_to == r.peer && m.model_version == q.sent_version) return;
  if (phase_->secure || phase_->roster) {
    // Secure aggregation: at the advertise step the setup again (a restarted client makes new
    // keys); at any later step the client may have lost its side of the round (a restart), and
    // could then never answer: it drops out now instead of holding the step to its deadline. An
    // edge aggregator that registers again has lost its relay of the round: it drops out too.
    if (phase_->secure && phase_->stage == SecureStage::kAdvertise && !phase_->task &&
        phase_->secure->relayedBy(m.client_id).empty() &&
        phase_->secure->inStep(SecureStage::kAdvertise, m.client_id)) {
      if (socket_.send(p.routing, phase_->secure->request(SecureStage::kAdvertise, m.client_id))) {
        q.sent_to = p.routing;
        q.sent_version = p.info.model_version;
      }
      return;
    }
    log_->info(
        "client {} registered again during secure aggregation's {} step; it drops out of "
        "the round",
        m.client_id, phase_->roster ? "roster" : stageName(phase_->stage));
    expired_[m.client_id].add(q.nonce);
    pending_.erase(pend);
    phase_->report->failed.push_back(m.client_id);
    return;
  }
  if (phase_->async) {
    expired_[m.client_id].add(q.nonce);
    pending_.erase(pend);
    phase_->async->failed(m.client_id);
    phase_->event = true;
  } else if (sendTask(p, q.nonce)) {
    q.sent_to = p.routing;
    q.sent_version = p.info.model_version;
  }
}

bool ZmqFleet::sendTask(Peer& peer, uint64_t nonce) {
  Phase& ph = *phase_;
  const PhaseTask& t = *ph.task;
  const uint64_t held = t.header.phase == 0 ? peer.info.model_version : 0;
  if (ph.encoded_for != t.header.model_version) {
    ph.encoded.clear();
    ph.encoded_for = t.header.model_version;
  }
  // A peer that cannot decode a quantised or stc downlink gets the broadcast model dense (keyed
  // apart).
  const bool dense = !peerDecodes(t.downlink, peer.info.qsgd_downlink, peer.info.stc_downlink,
                                  peer.info.block_downlink);
  std::vector<uint8_t> own;  // a mirrored downlink's task: this client's alone
  std::vector<uint8_t>* msgp = &own;
  if (!dense && downlinkMirrored(t.downlink) && t.header.phase == 0) {
    // Against the copy the fleet keeps of this client's model (its own difference, not cached).
    if (!copies_)
      copies_ = ClientCopies::forDownlink(*layout_, t.downlink, config_.downlink_density,
                                          config_.downlink_copies);
    own = encodeTask(
        t, copies_->encode(peer.info.id, held, t.model.current(), t.header.model_version), nonce);
  } else {
    const uint64_t key = dense ? ~uint64_t{0} : t.model.baseFor(held, t.downlink);
    auto it = ph.encoded.find(key);
    if (it == ph.encoded.end()) {
      // One encoding per version held; the nonce is patched per client.
      PhaseTask as_sent = t;
      if (dense) as_sent.downlink = Downlink::kDense;
      it = ph.encoded.emplace(key, encodeTask(as_sent, dense ? 0 : key)).first;
    }
    msgp = &it->second;
  }
  // Patched in place: send() copies the bytes into ZeroMQ's messages before it returns, so the
  // cached buffer serves every client without a model-sized copy each.
  std::vector<uint8_t>& msg = *msgp;
  pr::setTaskNonce(msg, nonce);
  if (t.control_acks && !t.header.control.empty()) {
    // encodeTask writes the field in every task with a control variate, so this cannot throw.
    const auto ack = t.control_acks->find(peer.info.id);
    pr::setTaskControlAck(msg, ack == t.control_acks->end() ? 0 : ack->second);
  }
  const bool ok = socket_.send(peer.routing, msg);
  // The client now holds this version (a client that could not apply it registers again and says
  // which version it holds), so the next delta is against it.
  if (ok && t.header.phase == 0) peer.info.model_version = t.header.model_version;
  if (ok) {
    if (ph.report) ph.report->downlink_bytes += msg.size();
    if (ph.eval) ph.eval->downlink_bytes += msg.size();
    if (ph.async) ph.async->started(msg.size());
  }
  return ok;
}

namespace {
// A partial may not weigh more, nor count more updates, than the examples its aggregator
// registered (`cap`, frozen when the task went out).
void checkPartialWeight(const compression::PartialView& p, uint64_t cap) {
  if (p.header.total_weight > static_cast<double>(cap) || p.header.count > cap)
    failInput(Errc::kBadWeight, "a partial of weight ", p.header.total_weight, " over ",
              p.header.count, " updates; the aggregator registered ", cap, " examples");
}
}  // namespace

void ZmqFleet::handleUpdate(const transport::Received& r, Peer& peer, bool partial) {
  const uint64_t id = peer.info.id;
  if (phase_ && phase_->secure)
    failInput(Errc::kUnexpectedMessage, partial ? "a partial aggregate" : "an update",
              " in the clear during a secure-aggregation step");
  auto pend = pending_.find(id);
  const bool open =
      phase_ && (phase_->agg || phase_->async) && pend != pending_.end() && !pend->second.evaluate;
  const auto bytes = r.bytes();
  // The nonce tells a late answer to a closed task from a replay or a forgery.
  auto checkNonce = [&](uint64_t nonce) {
    if (auto ex = expired_.find(id); ex != expired_.end() && ex->second.answeredWith(nonce))
      failInput(Errc::kDuplicate, "a second answer to a task already answered");
    if (auto ex = expired_.find(id); ex != expired_.end() && ex->second.has(nonce))
      failInput(Errc::kLate, "an answer to a task whose phase already closed");
    if (!open) failInput(Errc::kWrongSender, "an update without a task");
    if (nonce != pend->second.nonce)
      failInput(Errc::kBadNonce, "an update with another task's nonce");
  };
  // The answer, decoded and checked against its open task: an update from its client, or an edge
  // aggregator's partial of its clients' updates.
  const compression::UpdateView* u = nullptr;
  const compression::PartialView* p = nullptr;
  if (partial) {
    p = &decoder_.decodePartial(bytes);
    checkNonce(p->header.nonce);
    if (pend->second.role != pr::Role::kAggregator)
      failInput(Errc::kWrongSender, "a partial aggregate from a client");
  } else {
    u = &decoder_.decodeUpdate(bytes);
    if (u->header.client_id != id)
      failInput(Errc::kWrongSender, "an update claiming to be client ", u->header.client_id);
    checkNonce(u->header.nonce);
  }
  const uint64_t nonce = p ? p->header.nonce : u->header.nonce;
  if (phase_->async) {
    // The task's answer, whatever becomes of it: the peer is idle again.
    const Pending task = pend->second;
    closeAnswered(id, nonce);
    pending_.erase(pend);
    // Refused here (before the buffer): the task failed. Refused by the buffer (take() throws,
    // counted as refused): answered the same way, not a failure.
    phase_->event = true;
    const uint64_t from = p ? p->header.round : u->header.round;
    try {
      if (from != task.task_version)
        failInput(Errc::kWrongRound, p ? "a partial" : "an update", " from model version ", from,
                  " to a task of version ", task.task_version);
      if (p) checkPartialWeight(*p, task.num_examples);
    } catch (const InputError&) {
      phase_->async->failed(id);
      throw;
    }
    AsyncArrival a;
    a.client = id;
    a.update = u;
    a.partial = p;
    a.limits = ag::ClientLimits{task.num_examples};
    a.message = bytes;
    a.bytes = bytes.size();
    phase_->async->take(a);
    ++tally(id).updates;
    return;
  }
  if (p) {
    checkPartialWeight(*p, pend->second.num_examples);
    phase_->agg->merge(*p, id);
  } else {
    phase_->agg->add(*u, ag::ClientLimits{pend->second.num_examples});
  }
  phase_->report->uplink_bytes += bytes.size();
  phase_->report->completed.push_back(id);
  ++phase_->accepted;
  ++tally(id).updates;
  closeAnswered(id, nonce);
  pending_.erase(pend);
}

void ZmqFleet::handleSecure(const transport::Received& r, Peer& peer, pr::MessageKind kind) {
  const uint64_t id = peer.info.id;
  auto pend = pending_.find(id);
  if (!phase_ || !phase_->secure || kind != answerKind(phase_->stage))
    failInput(Errc::kUnexpectedMessage, "a ", pr::kindName(kind),
              " when no secure-aggregation step takes it");
  // An edge aggregator answers the masked-input step with its clients' ring sum; its other steps'
  // answers come in a SecAggRelay (a message of another kind does not close its step).
  const bool relays = !phase_->secure->relayedBy(id).empty();
  if (relays && kind != pr::MessageKind::kSecAggMasked)
    failInput(Errc::kUnexpectedMessage, "edge aggregator ", id, " sent a ", pr::kindName(kind),
              " of its own");
  if (pend == pending_.end() || pend->second.evaluate)
    failInput(Errc::kLate, "a ", pr::kindName(kind), " after its step closed for client ", id);
  const uint64_t nonce = pend->second.nonce;
  // Whatever the round makes of it, the client's step is over: an answer refused fails it.
  closeAnswered(id, nonce);
  pending_.erase(pend);
  try {
    if (relays) {
      phase_->secure->replyRelayed(id, r.bytes());
    } else {
      phase_->secure->reply(phase_->stage, id, r.bytes());
    }
  } catch (const InputError&) {
    phase_->report->failed.push_back(id);
    throw;
  }
  phase_->report->uplink_bytes += r.bytes().size();
  phase_->report->completed.push_back(id);
  ++phase_->accepted;
  if (phase_->task) ++tally(id).updates;  // the masked input: runPhase's step
}

// An edge aggregator's relayed answers: the clients it brings (secureRoster), or its clients'
// answers of the open exchange step, each handed to the round as if the client had sent it (one
// refused is refused to the aggregator and fails that client only).
void ZmqFleet::handleRelay(const transport::Received& r, Peer& peer) {
  const uint64_t id = peer.info.id;
  if (peer.info.role != pr::Role::kAggregator)
    failInput(Errc::kUnexpectedMessage, "client ", id, " relayed secure-aggregation messages");
  const pr::SecAggRelayMsg m =
      pr::decodeSecAggRelay(r.bytes(), pr::SecAggLimits{config_.limits.max_message_bytes});
  if (m.from != id) failInput(Errc::kWrongSender, "a relay from ", id, " names ", m.from);
  if (!m.common.empty())
    failInput(Errc::kUnexpectedEncoding, "aggregator ", id, " relayed a setup of its own");
  auto pend = pending_.find(id);
  const bool roster = phase_ && phase_->roster;
  if (!phase_ || (!roster && (!phase_->secure || phase_->task)))
    failInput(Errc::kUnexpectedMessage, "a secure-aggregation relay when no step takes it");
  if (pend == pending_.end() || pend->second.evaluate)
    failInput(Errc::kLate, "a secure-aggregation relay after its step closed for aggregator ", id);
  const pr::RelayStage want = roster ? pr::RelayStage::kRoster : relayStageOf(phase_->stage);
  const uint64_t round = roster ? phase_->roster_round : phase_->secure->round();
  const uint64_t nonce = roster ? phase_->roster_nonce : phase_->secure->nonce();
  if (m.round != round || m.nonce != nonce)
    failInput(Errc::kLate, "aggregator ", id, "'s relay of another exchange");
  if (m.stage != want)
    failInput(Errc::kUnexpectedMessage, "aggregator ", id, "'s relay of another step");
  if (roster) {
    // The clients it brings: none of this root's own nor an aggregator, within the ids secure
    // aggregation takes, at most kMaxRoster (a client two aggregators name is dropped from both
    // by the engine).
    if (m.items.size() > kMaxRoster)
      failInput(Errc::kSizeMismatch, "aggregator ", id, " names ", m.items.size(),
                " clients, at most ", kMaxRoster, " allowed");
    for (const auto& it : m.items)
      if (clients_.count(it.client) || config_.aggregator_ids.count(it.client) ||
          it.client >= privacy::kMaxSecAggId)
        failInput(Errc::kWrongSender, "aggregator ", id, " names client ", it.client,
                  ", which it cannot relay (the root's own, an aggregator, or an id beyond ",
                  privacy::kMaxSecAggId, ")");
  }
  closeAnswered(id, pend->second.nonce);
  pending_.erase(pend);
  phase_->report->uplink_bytes += r.bytes().size();
  phase_->report->completed.push_back(id);
  ++phase_->accepted;
  if (roster) {
    std::vector<uint64_t>& cs = (*phase_->roster)[id];
    for (const auto& it : m.items) cs.push_back(it.client);
    return;
  }
  for (const auto& it : m.items) {
    try {
      phase_->secure->replyVia(id, phase_->stage, it.client, it.message);
    } catch (const InputError& e) {
      refuse(peer.routing, e.code(),
             "aggregator " + std::to_string(id) + ", client " + std::to_string(it.client) + ": " +
                 e.what());
    }
  }
}

void ZmqFleet::handleDecline(const transport::Received& r, Peer& peer) {
  pr::RejectMsg m;
  try {
    m = pr::decodeReject(r.bytes());
  } catch (const InputError&) {
    return;  // a malformed Reject is dropped unanswered, as every Reject is
  }
  const uint64_t id = peer.info.id;
  const auto pend = pending_.find(id);
  if (pend == pending_.end() || !phase_ || phase_->closing || pend->second.evaluate) return;
  // The round its open request is of: a secure step's, or its task's.
  const uint64_t round = phase_->secure  ? phase_->secure->round()
                         : phase_->task  ? phase_->task->header.round
                         : phase_->async ? phase_->async->task().header.round
                                         : 0;
  if (m.round != 0 && m.round != round) return;  // about another round's request: late
  // A code this build does not know (a newer client's) is named by its number.
  const std::string code = m.code <= static_cast<uint32_t>(kLastErrc)
                               ? errcLabel(static_cast<Errc>(m.code))
                               : "code " + std::to_string(m.code);
  log_->info("client {} declined {} of round {} ({}: {}); it drops out of it now", id,
             phase_->secure
                 ? std::string("secure aggregation's ") + stageName(phase_->stage) + " step"
                 : std::string("its task"),
             round, code, m.message.substr(0, 200));
  failPending(pend);
}

std::unordered_map<uint64_t, ZmqFleet::Pending>::iterator ZmqFleet::failPending(
    std::unordered_map<uint64_t, Pending>::iterator it) {
  const uint64_t id = it->first;
  expired_[id].add(it->second.nonce);
  it = pending_.erase(it);
  if (phase_ && phase_->report) phase_->report->failed.push_back(id);
  if (phase_ && phase_->async) {
    phase_->async->failed(id);
    phase_->event = true;
  }
  return it;
}

bool ZmqFleet::sendStep(Peer& peer, SecureSteps& round, SecureStage stage, uint32_t deadline_ms,
                        uint64_t& bytes) {
  std::vector<uint8_t> msg;
  if (!round.relayedBy(peer.info.id).empty()) {
    const pr::SecAggRelayMsg m = relayRequest(round, peer.info.id, stage, deadline_ms);
    if (m.items.empty()) return false;
    msg = pr::encode(m);
  } else {
    if (!round.inStep(stage, peer.info.id)) return false;
    msg = round.request(stage, peer.info.id);
  }
  if (!socket_.send(peer.routing, msg)) return false;
  bytes += msg.size();
  return true;
}

std::map<uint64_t, std::vector<uint64_t>> ZmqFleet::secureRoster(
    std::span<const ClientInfo> aggregators, uint64_t round, uint32_t deadline_ms,
    PhaseReport& report) {
  std::map<uint64_t, std::vector<uint64_t>> roster;
  auto rng = seededRng();
  Phase ph;
  ph.report = &report;
  ph.roster = &roster;
  ph.roster_round = round;
  ph.roster_nonce = randomNonZero(rng);
  phase_ = &ph;
  pending_.clear();
  PhaseReset reset{this};
  const std::vector<uint8_t> ask = pr::encode(
      pr::SecAggRelayMsg{0, round, ph.roster_nonce, pr::RelayStage::kRoster, deadline_ms, {}, {}});
  for (const ClientInfo& c : aggregators) {
    auto it = clients_.find(c.id);
    if (it == clients_.end() || it->second.info.role != pr::Role::kAggregator ||
        !socket_.send(it->second.routing, ask)) {
      report.failed.push_back(c.id);
      continue;
    }
    report.downlink_bytes += ask.size();
    pending_[c.id] = pendingOf(it->second, randomNonZero(rng));
  }
  awaitAnswers(deadline_ms, report, [&](uint64_t id) {
    log_->info("edge aggregator {} did not say which clients it brings to round {} in time", id,
               round);
  });
  return roster;
}

void ZmqFleet::handleEvaluation(const transport::Received& r, Peer& peer) {
  const uint64_t id = peer.info.id;
  auto pend = pending_.find(id);
  const pr::EvaluationMsg e = pr::decodeEvaluation(r.bytes());
  if (!phase_ || !phase_->eval || pend == pending_.end() || !pend->second.evaluate) {
    if (auto ex = expired_.find(id); ex != expired_.end() && ex->second.answeredWith(e.nonce))
      failInput(Errc::kDuplicate, "a second answer to an evaluation task already answered");
    failInput(expired_.count(id) ? Errc::kLate : Errc::kWrongSender,
              "an evaluation without an evaluation task");
  }
  if (e.client_id != id)
    failInput(Errc::kWrongSender, "an evaluation claiming to be client ", e.client_id);
  if (e.nonce != pend->second.nonce)
    failInput(Errc::kBadNonce, "an evaluation with another task's nonce");
  if (e.num_examples == 0 || e.num_examples > std::max<uint64_t>(pend->second.eval_examples, 1))
    failInput(Errc::kBadWeight, "an evaluation over ", e.num_examples, " examples; ",
              pend->second.eval_examples, " registered");
  EvalReport& ev = *phase_->eval;
  ev.add(e.num_examples, e.loss,
         e.accuracy);  // losses bounded by the decoder, examples by registration
  ev.uplink_bytes += r.bytes().size();
  closeAnswered(id, e.nonce);
  pending_.erase(pend);
  ++phase_->accepted;
}

void ZmqFleet::expireSilent() {
  const auto cutoff = config_.clock->now() - milliseconds(config_.silence_ms);
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto c = clients_.find(it->first);
    if (c == clients_.end() || c->second.last_seen < cutoff) {
      log_->warn("client {} went silent; failed for this phase", it->first);
      it = failPending(it);
    } else {
      ++it;
    }
  }
  // Forget clients silent for long (they re-register when they come back).
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (it->second.last_seen < cutoff - milliseconds(10 * config_.silence_ms) &&
        !pending_.count(it->first)) {
      by_routing_.erase(it->second.routing);
      it = clients_.erase(it);
    } else {
      ++it;
    }
  }
}

ZmqFleet::Pending ZmqFleet::pendingOf(const Peer& p, uint64_t nonce, bool evaluate) const {
  return Pending{nonce,       evaluate,  p.info.num_examples, p.info.eval_examples,
                 p.info.role, p.routing, p.info.model_version};
}

void ZmqFleet::awaitAnswers(uint32_t deadline_ms, PhaseReport& report,
                            const std::function<void(uint64_t)>& missed) {
  const uint64_t refused_before = refusedTotal();
  const auto deadline = config_.clock->now() + milliseconds(deadline_ms);
  while (!pending_.empty() && config_.clock->now() < deadline) {
    poll(std::chrono::duration_cast<milliseconds>(deadline - config_.clock->now()));
    expireSilent();
  }
  takeQueued();
  report.refused = refusedTotal() - refused_before;
  for (const auto& [id, p] : pending_) {
    report.failed.push_back(id);
    missed(id);
  }
}

void ZmqFleet::takeQueued(size_t target) {
  if (!phase_) return;
  phase_->closing = true;  // no task is sent again now
  for (size_t i = 0; i < 1000 && !pending_.empty() && phase_->accepted < target; ++i) {
    auto r = socket_.receive(milliseconds(0));
    if (!r) return;
    handle(*r);
  }
}

void ZmqFleet::poll(milliseconds timeout) {
  if (stop_ && stop_->load()) STARLING_THROW(Stopped, "asked to stop");
  if (auto r = socket_.receive(std::clamp(timeout, milliseconds(0), milliseconds(100)))) handle(*r);
  if (!cut_due_.empty()) cutRevoked();
  // Refused handshakes never reach receive(): say who knocked (an unknown key once left
  // nothing in the log).
  // At most kRefusalLines lines per kRefusalWindow, then one count for the rest of the window, so
  // a flood of handshakes cannot flood the log.
  uint64_t dropped = 0;
  const auto now = config_.clock->now();
  if (now - refusal_window_ >= kRefusalWindow) {
    if (refusals_unlisted_)
      log_->warn("refused {} more connections in the last {} s (not listed one by one)",
                 refusals_unlisted_,
                 std::chrono::duration_cast<std::chrono::seconds>(kRefusalWindow).count());
    refusal_window_ = now;
    refusal_lines_ = 0;
    refusals_unlisted_ = 0;
  }
  for (const auto& z : socket_.takeRefusedHandshakes(&dropped)) {
    ++refused_handshakes_;
    if (refusal_lines_ < kRefusalLines) {
      ++refusal_lines_;
      log_->warn("refused a connection from {}: {}{}",
                 z.address.empty() ? "an unknown address" : z.address, z.reason,
                 z.key.empty() ? "" : " (key " + z.key + "...)");
    } else {
      ++refusals_unlisted_;
    }
  }
  refused_handshakes_ += dropped;
  refusals_unlisted_ += dropped;
  logConnections();
  if (observer_ && now - observed_ >= observe_every_) {
    observed_ = now;
    observer_(*this);
  }
  if (idle_) idle_();
}

// What ZeroMQ's events say of the connections since the last line: a plaintext or broken
// handshake never reaches receive() or the ZAP handler, and a connection dropped for a frame over
// the socket's ceiling leaves no message behind, so these lines are the only trace of either.
void ZmqFleet::logConnections() {
  const transport::ConnectionCounts& now = socket_.connections();
  transport::ConnectionCounts& was = connections_logged_;
  const uint64_t mechanism = now.refused_mechanism - was.refused_mechanism;
  const uint64_t protocol = now.refused_protocol - was.refused_protocol;
  const uint64_t unfinished = now.failed_handshake - was.failed_handshake;
  const uint64_t dropped = now.dropped() - std::min(was.dropped(), now.dropped());
  if (mechanism + protocol + unfinished + dropped == 0) return;
  const auto t = config_.clock->now();
  if (t - connections_log_ < std::chrono::seconds(1)) return;  // the rest comes in the next line
  connections_log_ = t;
  if (mechanism)
    log_->warn(
        "refused {} connection(s) of another security mechanism: plain TCP (ZMTP's NULL "
        "mechanism) on this {} port, or the reverse ({} in all)",
        mechanism, socket_.secure() ? "CURVE" : "plain TCP", now.refused_mechanism);
  if (protocol)
    log_->warn(
        "refused {} connection(s) for a ZMTP or CURVE protocol error: not a ZeroMQ peer, or "
        "one holding another server key ({} in all)",
        protocol, now.refused_protocol);
  if (unfinished)
    log_->warn(
        "{} connection(s) dropped before their handshake finished: reset, or silent past "
        "the handshake timeout ({} in all)",
        unfinished, now.failed_handshake);
  if (dropped)
    log_->info(
        "{} connection(s) closed after their handshake: the peer left, its heartbeats "
        "stopped, or it sent a frame over {} bytes, which ZeroMQ drops a connection for "
        "unread ({} in all)",
        dropped, socket_.limits().frameCeiling(), now.dropped());
  was = now;
}

void ZmqFleet::service(milliseconds timeout) {
  const auto until = config_.clock->now() + timeout;
  do {
    poll(std::chrono::duration_cast<milliseconds>(until - config_.clock->now()));
  } while (config_.clock->now() < until);
}

ClientPool ZmqFleet::waitForClients(size_t min, milliseconds timeout, uint64_t /*round*/) {
  const auto until = config_.clock->now() + timeout;
  for (;;) {
    auto avail = available();
    if (avail.size() >= min || config_.clock->now() >= until) return avail;
    poll(milliseconds(50));
    // A drain (server/admin.h) ends a round that is only waiting for its clients: nothing of it
    // has started, so it runs again when the root is back.
    if (drain_waits_)
      STARLING_THROW(Stopped, "drained while round waited for clients (", avail.size(), " of ", min,
                     ")");
  }
}

PhaseReport ZmqFleet::exchange(SecureStage stage, SecureSteps& round,
                               std::span<const ClientInfo> participants, uint32_t deadline_ms) {
  PhaseReport report;
  auto rng = seededRng();
  Phase ph;
  ph.secure = &round;
  ph.stage = stage;
  ph.report = &report;
  phase_ = &ph;
  pending_.clear();
  PhaseReset reset{this};
  for (const ClientInfo& c : participants) {
    auto it = clients_.find(c.id);
    if (it == clients_.end()) {
      report.failed.push_back(c.id);
      continue;
    }
    if (!sendStep(it->second, round, stage, deadline_ms, report.downlink_bytes)) {
      report.failed.push_back(c.id);
      continue;
    }
    pending_[c.id] = pendingOf(it->second, randomNonZero(rng));
  }
  ph.sent = ph.target = pending_.size();
  ph.deadline = config_.clock->now() + milliseconds(deadline_ms);
  awaitAnswers(deadline_ms, report, [&](uint64_t id) {
    log_->info("client {} did not answer secure aggregation's {} step of round {} in time", id,
               stageName(stage), round.round());
  });
  return report;
}

PhaseReport ZmqFleet::runPhase(const PhaseTask& task, std::span<const ClientInfo> participants,
                               size_t target, ag::PhaseAggregator& agg) {
  PhaseReport report;
  auto rng = seededRng();
  Phase ph;
  ph.task = &task;
  ph.agg = &agg;
  ph.report = &report;
  ph.secure = task.secure;
  ph.stage = SecureStage::kMaskedInput;
  phase_ = &ph;
  pending_.clear();
  PhaseReset reset{this};
  for (const ClientInfo& c : participants) {
    auto it = clients_.find(c.id);
    const uint64_t nonce = randomNonZero(rng);
    if (it != clients_.end() && task.secure) {
      // Its shares first (an aggregator's, those of its clients): the task that follows on the
      // same connection is answered with them.
      if (!sendStep(it->second, *task.secure, SecureStage::kMaskedInput, task.header.deadline_ms,
                    report.downlink_bytes)) {
        report.failed.push_back(c.id);
        continue;
      }
    }
    if (it == clients_.end() || !sendTask(it->second, nonce)) {
      report.failed.push_back(c.id);
      continue;
    }
    pending_[c.id] = pendingOf(it->second, nonce);
  }
  const uint64_t refused_before = refusedTotal();
  const auto deadline = config_.clock->now() + milliseconds(task.header.deadline_ms);
  ph.sent = pending_.size();
  ph.target = target;
  ph.deadline = deadline;
  while (!pending_.empty() && ph.accepted < target && config_.clock->now() < deadline) {
    poll(std::chrono::duration_cast<milliseconds>(deadline - config_.clock->now()));
    expireSilent();
  }
  if (ph.accepted < target) takeQueued(target);
  report.refused = refusedTotal() - refused_before;
  for (const auto& [id, p] : pending_) {
    report.failed.push_back(id);
    log_->info("client {} did not deliver round {} phase {} in time", id, task.header.round,
               task.header.phase);
  }
  return report;
}

EvalReport ZmqFleet::evaluate(const PhaseTask& task, const ClientPool& participants) {
  EvalReport ev;
  auto rng = seededRng();
  Phase ph;
  ph.task = &task;
  ph.eval = &ev;
  phase_ = &ph;
  pending_.clear();
  PhaseReset reset{this};  // also when Stopped (or anything) escapes
  for (const ClientInfo& c : participants) {
    auto it = clients_.find(c.id);
    const uint64_t nonce = randomNonZero(rng);
    if (it != clients_.end() && sendTask(it->second, nonce))
      pending_[c.id] = pendingOf(it->second, nonce, true);
  }
  const auto deadline = config_.clock->now() + milliseconds(task.header.deadline_ms);
  ph.sent = ph.target = pending_.size();
  ph.deadline = deadline;
  while (!pending_.empty() && config_.clock->now() < deadline) {
    poll(std::chrono::duration_cast<milliseconds>(deadline - config_.clock->now()));
    expireSilent();
  }
  return ev;
}

void ZmqFleet::finish(const std::string& reason) {
  for (const auto& [id, p] : clients_)
    socket_.send(p.routing, pr::encode(pr::ShutdownMsg{0, reason}));
  log_->info("federation finished: {}", reason);
}

// The fleet in asynchronous rounds (asyncFleet()): the buffered engine's AsyncFleet on the
// fleet's clock. Its phase lives as long as it does.
class ZmqFleet::Async final : public AsyncFleet {
 public:
  Async(ZmqFleet& f, const AsyncFleetOptions& opt)
      : f_(f), opt_((check(f, opt), opt)), rng_(seededRng()), reset_{&f} {
    f.pending_.clear();
    f.phase_ = &ph_;
    const auto now = f.config_.clock->now();
    filled_at_ = now - milliseconds(1000);
    stall_said_ = now - std::chrono::seconds(3600);
  }

  double now() const override {
    return std::chrono::duration<double>(f_.config_.clock->now().time_since_epoch()).count();
  }
  size_t open() const override { return f_.pending_.size(); }

  // Handed out when a task closed, the server stepped, or every 50 ms (registrations): not on
  // every turn, which would sort the registry each time.
  size_t start(size_t n, AsyncIntake& in) override {
    ph_.async = &in;
    ph_.task = &in.task();
    // Drained or paused: the open tasks finish, no new one starts.
    if (f_.drain_waits_ || f_.hold_tasks_) return 0;
    const auto now = f_.config_.clock->now();
    const size_t room =
        f_.pending_.size() < opt_.concurrency ? opt_.concurrency - f_.pending_.size() : 0;
    const size_t slots = std::min(n, room);
    if (slots == 0) return 0;
    if (f_.pending_.size() == pending_then_ && in.steps() == steps_then_ &&
        now - filled_at_ < milliseconds(50))
      return 0;
    filled_at_ = now;
    pending_then_ = f_.pending_.size();
    steps_then_ = in.steps();
    const uint64_t version = ph_.task->header.model_version;
    const std::vector<ClientInfo> avail = f_.available();
    if (avail.size() < opt_.min_available) return 0;
    idle_.clear();
    for (const ClientInfo& c : avail)
      if (!f_.pending_.count(c.id) && in.mayStart(c.id)) idle_.push_back(&f_.clients_.at(c.id));
    std::shuffle(idle_.begin(), idle_.end(), rng_);
    size_t handed = 0;
    for (Peer* p : idle_) {
      if (handed >= slots) break;
      const uint64_t nonce = randomNonZero(rng_);
      if (!f_.sendTask(*p, nonce)) continue;
      Pending q{nonce,        false,      p->info.num_examples, p->info.eval_examples,
                p->info.role, p->routing, p->info.model_version};
      q.task_version = version;
      q.deadline = now + milliseconds(opt_.task_deadline_ms);
      f_.pending_[p->info.id] = q;
      ++handed;
    }
    pending_then_ = f_.pending_.size();
    // Nothing open and no one may start: every available client has sent its update from this
    // version, and the version has not moved on (FedBuff: a step needs K clients on a version).
    if (f_.pending_.empty() && idle_.empty() && now - stall_said_ >= std::chrono::seconds(30)) {
      stall_said_ = now;
      f_.log_->warn(
          "no peer can start a task: the {} available clients and edge aggregators each sent an "
          "update from model version {}; waiting for more to register",
          avail.size(), version);
    }
    return handed;
  }

  // One message (waiting up to 100 ms, or until `until`), then whatever else is queued, one
  // taken answer per call; once the queue is empty, the silent and the late are failed.
  AsyncEvent next(double until, AsyncIntake& in) override {
    ph_.async = &in;
    ph_.task = &in.task();
    ph_.event = false;
    if (f_.drain_waits_ && f_.pending_.empty() && !draining_)
      STARLING_THROW(Stopped, "drained: every open task was answered or failed");
    if (!draining_) {
      const double wait_ms = (until - now()) * 1000.0;
      // Asked for what is due now: the turn's queue was taken already (the engine drains after
      // each event; a new turn waits for the next call with a later `until`).
      if (wait_ms <= 0.0 && turned_) return AsyncEvent::kNothing;
      turned_ = true;
      f_.poll(milliseconds(wait_ms >= 100.0 ? 100 : wait_ms <= 0.0 ? 0 : int64_t(wait_ms) + 1));
      draining_ = true;
      drained_ = 0;
      if (ph_.event) return AsyncEvent::kTaken;
    }
    while (drained_ < 1000) {
      const auto r = f_.socket_.receive(milliseconds(0));
      if (!r) break;
      ++drained_;
      f_.handle(*r);
      if (ph_.event) return AsyncEvent::kTaken;
    }
    draining_ = false;
    f_.expireSilent();
    const auto after = f_.config_.clock->now();
    for (auto it = f_.pending_.begin(); it != f_.pending_.end();) {
      if (it->second.deadline < after) {
        f_.log_->info("client {} did not deliver its task of version {} in time", it->first,
                      it->second.task_version);
        f_.expired_[it->first].add(it->second.nonce);
        const uint64_t id = it->first;
        it = f_.pending_.erase(it);
        in.failed(id);
        ph_.event = true;
      } else {
        ++it;
      }
    }
    return ph_.event ? AsyncEvent::kTaken : AsyncEvent::kNothing;
  }

 private:
  static void check(const ZmqFleet& f, const AsyncFleetOptions& opt) {
    STARLING_CHECK_ARG(opt.concurrency >= 1 && opt.task_deadline_ms >= 10,
                       "asynchronous rounds need a concurrency of at least 1 and a task deadline "
                       "of at least 10 ms");
    STARLING_CHECK_ARG(f.phase_ == nullptr, "the fleet is in a phase already");
  }

  ZmqFleet& f_;
  AsyncFleetOptions opt_;
  std::mt19937_64 rng_;
  Phase ph_;
  PhaseReset reset_;  // declared after ph_: closes the tasks before ph_ goes
  std::vector<Peer*> idle_;
  size_t pending_then_ = ~size_t{0};
  uint64_t steps_then_ = ~uint64_t{0};
  Steady::time_point filled_at_{}, stall_said_{};
  bool draining_ = false, turned_ = false;
  size_t drained_ = 0;
};

std::unique_ptr<AsyncFleet> ZmqFleet::asyncFleet(const AsyncFleetOptions& opt) {
  return std::make_unique<Async>(*this, opt);
}

}  // namespace starling::server
