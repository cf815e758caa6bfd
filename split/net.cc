#include "split/net.h"

#include <cmath>
#include <filesystem>
#include <random>
#include <thread>

#include "aggregation/partial.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/framed_file.h"
#include "core/input_error.h"
#include "core/rng.h"
#include "data/sampling.h"
#include "protocol/control.h"

namespace starling::split {
namespace pr = starling::protocol;
using Steady = std::chrono::steady_clock;  // not the injectable starling::Clock
using std::chrono::milliseconds;

namespace {

// A split cloud checkpoint; version 2 is version 1 in the files' frame (core/framed_file.h).
constexpr FileFormat kCloudFile{0x43504c53 /* "SLPC" */, "Starling split cloud checkpoint", 1, 2,
                                2};

uint64_t fnv(uint64_t h, std::string_view s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

uint64_t sessionFingerprint(const SplitModel& model, const std::string& up,
                            const std::string& down) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = mix(h, model.bottom().fingerprint());
  h = mix(h, model.top().fingerprint());
  h = mix(h, model.activationSize());
  h = fnv(h, model.describe());  // the model, the cut, the weight-side rank, a removed skip
  h = fnv(h, up);
  h = mix(h, 0x1f);
  return fnv(h, down);
}

void saveCloudCheckpoint(const std::string& path, uint64_t fingerprint, uint64_t steps,
                         std::span<const float> top) {
  std::vector<uint8_t> bytes;
  ByteWriter w(bytes);
  w.u64(fingerprint);
  w.u64(steps);
  w.floats(top);
  writeFramed(path, kCloudFile, bytes);
}

std::optional<CloudCheckpoint> loadCloudCheckpoint(const std::string& path, uint64_t fingerprint,
                                                   size_t numel) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  const auto bytes = readFile(path, uint64_t{4} << 30);
  const std::string what = "split cloud checkpoint " + path;
  ByteReader r(unframe(kCloudFile, bytes, what).payload, what);
  if (r.u64() != fingerprint)
    r.fail("it is of another cut model or other codecs (fingerprint differs)");
  CloudCheckpoint c;
  c.steps = r.u64();
  r.floats(c.top);
  r.finish();
  if (c.top.size() != numel) r.fail(c.top.size(), " parameters, the top part has ", numel);
  for (float x : c.top)
    if (!std::isfinite(x)) r.fail("a parameter is not finite");
  return c;
}

// ---------------------------------------------------------------- cloud

struct SplitCloudServer::FedEpoch {
  std::unique_ptr<aggregation::PartialAggregate> sum;
  std::vector<std::pair<std::string, uint64_t>> contributors;  // routing id, session
  std::vector<uint64_t> edges;
  Steady::time_point first;
  std::vector<float> mean;
  bool done = false;
};

SplitCloudServer::SplitCloudServer(transport::Context& context, SplitCloud& cloud,
                                   CloudServerConfig config)
    : cloud_(cloud), cfg_(std::move(config)) {
  if (cfg_.checkpoint_every == 0)
    STARLING_THROW(ConfigError, "cloud.checkpoint_every must be at least 1");
  if (cfg_.max_sessions == 0) STARLING_THROW(ConfigError, "cloud.max_sessions must be at least 1");
  if (cfg_.edge_timeout.count() <= 0)
    STARLING_THROW(ConfigError, "cloud.edge_timeout_ms must be positive");
  socket_ =
      std::make_unique<transport::ServerSocket>(context, cfg_.bind, cfg_.security, cfg_.limits);
  stats_.steps = cfg_.steps_done;
  std::random_device rd;
  next_session_ = (uint64_t{rd()} << 32 | rd()) | 1;  // sessions of a restarted cloud differ
}

SplitCloudServer::~SplitCloudServer() = default;

std::string SplitCloudServer::endpoint() const { return socket_->endpoint(); }

void SplitCloudServer::note(const std::string& s) const {
  if (cfg_.log) cfg_.log(s);
}

void SplitCloudServer::refuse(const std::string& peer, int kind, Errc code,
                              const std::string& message) {
  ++stats_.refused;
  note("refused " + (peer.empty() ? std::string("a peer") : "a message") + ": " + message);
  if (peer.empty()) return;
  pr::RejectMsg rej;
  rej.kind = static_cast<pr::RejectKind>(kind);
  rej.code = static_cast<uint32_t>(code);
  rej.message = message;
  rej.round = cur_step_;  // the request this answers: the edge ignores a refusal of an earlier one
  rej.nonce = cur_session_;
  socket_->send(peer, pr::encode(rej));
}

void SplitCloudServer::close(std::map<std::string, Session>::iterator it) {
  cloud_.forget(it->second.edge_id);
  sessions_.erase(it);
}

void SplitCloudServer::poll(milliseconds timeout) {
  if (auto r = socket_->receive(timeout)) {
    cur_session_ = cur_step_ = 0;
    try {
      handle(*r);
    } catch (const InputError& e) {
      const auto kind = e.code() == Errc::kBusy ? pr::RejectKind::kBusy : pr::RejectKind::kRefused;
      refuse(r->peer, static_cast<int>(kind), e.code(), e.what());
    } catch (const std::exception&
                 e) {  // not the peer's fault (memory, a bug): logged, the cloud goes on
      refuse(r->peer, static_cast<int>(pr::RejectKind::kRefused), Errc::kMalformed,
             std::string("the cloud could not serve this message: ") + e.what());
    }
  }
  const auto now = Steady::now();
  for (auto& [epoch, f] : fed_)
    if (!f->done && now - f->first > cfg_.splitfed_wait) complete(epoch, *f);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    auto next = std::next(it);
    if (now - it->second.last_seen > cfg_.edge_timeout) {
      ++stats_.timed_out;
      note("edge " + std::to_string(it->second.edge_id) + " silent for " +
           std::to_string(cfg_.edge_timeout.count()) + " ms: session closed");
      close(it);
    }
    it = next;
  }
}

void SplitCloudServer::handle(const transport::Received& r) {
  if (!r.ok()) {
    const int kind = r.error->code() == Errc::kBusy ? static_cast<int>(pr::RejectKind::kBusy)
                                                    : static_cast<int>(pr::RejectKind::kRefused);
    refuse(r.error->code() == Errc::kRateLimited ? std::string() : r.peer, kind, r.error->code(),
           r.error->what());
    return;
  }
  const auto kind = pr::peekKind(r.bytes());
  if (!kind) failInput(Errc::kMalformed, "not a Starling message (", r.bytes().size(), " bytes)");
  switch (*kind) {
    case pr::MessageKind::kSplitHello:
      hello(r);
      return;
    case pr::MessageKind::kSplitStep:
      step(r);
      return;
    case pr::MessageKind::kSplitBottom:
      bottom(r);
      return;
    case pr::MessageKind::kShutdown: {
      pr::decodeShutdown(r.bytes());
      auto it = sessions_.find(r.peer);
      if (it == sessions_.end()) return;
      if (r.authenticated_id && *r.authenticated_id != it->second.edge_id)
        return;  // not its session
      ++stats_.goodbyes;
      note("edge " + std::to_string(it->second.edge_id) + " said goodbye");
      close(it);
      return;
    }
    default:
      failInput(Errc::kUnexpectedMessage,
                "a split cloud takes SplitHello, SplitStep, SplitBottom and Shutdown, not ",
                pr::kindName(*kind));
  }
}

void SplitCloudServer::hello(const transport::Received& r) {
  const pr::SplitHelloMsg h =
      pr::decodeSplitHello(r.bytes(), pr::ControlLimits{cfg_.limits.max_message_bytes});
  if (r.authenticated_id && *r.authenticated_id != h.edge_id)
    failInput(Errc::kWrongSender, "hello as edge ", h.edge_id, " from the key listed as ",
              *r.authenticated_id);
  if (h.fingerprint != cfg_.fingerprint || h.up != cfg_.up || h.down != cfg_.down)
    failInput(
        Errc::kFingerprintMismatch, "this cloud serves another cut model or other codecs (up '",
        cfg_.up, "', down '", cfg_.down, "'); edge ", h.edge_id, " asked for up '", h.up,
        "', down '", h.down, "'",
        h.fingerprint != cfg_.fingerprint ? " and another cut model (fingerprint differs)" : "");
  if (auto own = sessions_.find(r.peer); own != sessions_.end()) {
    if (own->second.edge_id == h.edge_id && own->second.last_step == 0) {
      // A hello sent again before any step (its answer was slow or lost): the same session.
      if (!socket_->send(r.peer, pr::encode(pr::SplitReplyMsg{own->second.id, 0, 0, 0, 0, {}})))
        ++stats_.replies_dropped;
      return;
    }
    if (own->second.edge_id != h.edge_id && r.authenticated_id)
      failInput(Errc::kWrongSender, "edge ", h.edge_id, " on the connection of edge ",
                own->second.edge_id);
    close(own);  // the same edge starting again, or (insecure) another edge on this routing id
  }
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it)
    if (it->second.edge_id ==
        h.edge_id) {  // the edge restarted, or reconnected from another routing id
      note("edge " + std::to_string(h.edge_id) + " opened a new session; its old one is closed");
      close(it);
      break;
    }
  if (sessions_.count(r.peer) == 0 && sessions_.size() >= cfg_.max_sessions)
    failInput(Errc::kBusy, "the cloud serves its maximum of ", cfg_.max_sessions,
              " edge devices (cloud.max_sessions)");
  Session s;
  s.edge_id = h.edge_id;
  s.id = next_session_++;
  s.last_seen = Steady::now();
  ++stats_.hellos;
  note("edge " + std::to_string(h.edge_id) + " connected (session " + std::to_string(s.id) + ")");
  const uint64_t id = s.id;
  sessions_[r.peer] = std::move(s);
  if (!socket_->send(r.peer, pr::encode(pr::SplitReplyMsg{id, 0, 0, 0, 0, {}})))
    ++stats_.replies_dropped;
}

SplitCloudServer::Session* SplitCloudServer::sessionOf(const transport::Received& r,
                                                       uint64_t session, uint64_t request,
                                                       const char* what) {
  cur_session_ = session;
  cur_step_ = request;
  auto it = sessions_.find(r.peer);
  if (it == sessions_.end() || it->second.id != session) {
    refuse(r.peer, static_cast<int>(pr::RejectKind::kNotRegistered), Errc::kNotRegistered,
           "no session " + std::to_string(session) + " on this connection: send SplitHello");
    return nullptr;
  }
  Session& s = it->second;
  if (r.authenticated_id && *r.authenticated_id != s.edge_id)
    failInput(Errc::kWrongSender, "a ", what, " in edge ", s.edge_id,
              "'s session from the key listed as ", *r.authenticated_id);
  s.last_seen = Steady::now();
  return &s;
}

void SplitCloudServer::step(const transport::Received& r) {
  pr::SplitStepMsg m =
      pr::decodeSplitStep(r.bytes(), pr::ControlLimits{cfg_.limits.max_message_bytes});
  Session* found = sessionOf(r, m.session, m.step, "step");
  if (!found) return;
  Session& s = *found;
  if (m.step == s.last_step) {  // sent again: the same answer once, no second update
    if (s.last_reply.empty())
      return;  // answered again already (or dropped): a peer cannot make us resend forever
    ++stats_.duplicates;
    if (!socket_->send(r.peer, s.last_reply)) ++stats_.replies_dropped;
    s.last_reply.clear();
    s.last_reply.shrink_to_fit();
    return;
  }
  if (m.step <= s.last_step)
    failInput(Errc::kLate, "step ", m.step, " of edge ", s.edge_id, " after its step ",
              s.last_step);
  const auto t0 = Steady::now();
  SplitCloud::Reply rep;
  const bool train = m.kind != pr::SplitStepKind::kEvaluate;
  if (train)
    rep = cloud_.step(s.edge_id, m.activations, m.labels, m.examples,
                      m.kind == pr::SplitStepKind::kTrain);
  else
    rep = cloud_.evaluate(m.activations, m.labels, m.examples);
  const double secs = std::chrono::duration<double>(Steady::now() - t0).count();
  stats_.compute_seconds += secs;
  if (train) {
    ++stats_.steps;
    ++since_checkpoint_;
  } else {
    ++stats_.evaluations;
  }
  pr::SplitReplyMsg reply{s.id,
                          m.step,
                          rep.loss,
                          rep.correct,
                          static_cast<uint64_t>(secs * 1e6),
                          std::move(rep.gradient)};
  std::vector<uint8_t> encoded = pr::encode(reply);
  s.last_step = m.step;
  s.last_reply = std::move(encoded);
  if (!socket_->send(r.peer, s.last_reply)) {
    ++stats_.replies_dropped;
    note("edge " + std::to_string(s.edge_id) + " is gone: the reply to its step " +
         std::to_string(m.step) + " is dropped");
  }
  if (since_checkpoint_ >= cfg_.checkpoint_every) {
    try {
      saveCheckpoint();
    } catch (const std::exception&
                 e) {  // the steps go on; the checkpoint is tried again after as many steps
      note(std::string("checkpoint failed: ") + e.what());
    }
  }
}

void SplitCloudServer::bottom(const transport::Received& r) {
  pr::SplitBottomMsg m =
      pr::decodeSplitBottom(r.bytes(), pr::ControlLimits{cfg_.limits.max_message_bytes});
  Session* found = sessionOf(r, m.session, m.epoch, "bottom");
  if (!found) return;
  Session& s = *found;
  if (cfg_.splitfed_edges == 0)
    failInput(Errc::kUnexpectedMessage, "this cloud does not run SplitFed (cloud.splitfed_edges)");
  const ParamLayout& layout = cloud_.model().bottom();
  if (m.bottom.size() != layout.numel())
    failInput(Errc::kSizeMismatch, "a bottom of ", m.bottom.size(), " parameters, the cut's has ",
              layout.numel());
  for (size_t i = 0; i < m.bottom.size(); ++i)
    if (std::fabs(m.bottom[i]) > cfg_.max_abs)
      failInput(Errc::kValueTooLarge, "bottom parameter ", i, " (", m.bottom[i], ") exceeds ",
                cfg_.max_abs);
  if (m.examples > (uint64_t{1} << 31))
    failInput(Errc::kBadWeight, "a bottom weighted by ", m.examples, " examples");
  auto fit = fed_.find(m.epoch);
  if (fit == fed_.end()) {
    // At most 4 epochs kept: the oldest finished ones go first; a fifth pending one is refused.
    while (fed_.size() >= 4) {
      auto done =
          std::find_if(fed_.begin(), fed_.end(), [](const auto& e) { return e.second->done; });
      if (done == fed_.end())
        failInput(Errc::kWrongRound, "SplitFed epoch ", m.epoch, " while 4 epochs are pending");
      fed_.erase(done);
    }
    auto f = std::make_unique<FedEpoch>();
    f->sum = std::make_unique<aggregation::PartialAggregate>(
        std::make_shared<const aggregation::AggregateLayout>(
            std::make_shared<const ParamLayout>(layout), m.epoch, 0, nullptr,
            std::vector<std::string>{}));
    f->first = Steady::now();
    fit = fed_.emplace(m.epoch, std::move(f)).first;
  }
  FedEpoch& f = *fit->second;
  if (f.done) {  // late, or sent again: the epoch's average as it stands
    pr::SplitAverageMsg avg{s.id, m.epoch, static_cast<uint32_t>(f.edges.size()), f.mean};
    if (!socket_->send(r.peer, pr::encode(avg))) ++stats_.replies_dropped;
    return;
  }
  if (std::find(f.edges.begin(), f.edges.end(), s.edge_id) != f.edges.end())
    return;  // sent again while pending
  compression::UpdateView u;
  u.header = {layout.fingerprint(), m.epoch, 0, s.edge_id, m.examples, 0};
  for (const auto& t : layout.tensors())
    u.tensors.push_back(
        compression::DenseF32View{std::span<const float>(m.bottom).subspan(t.offset, t.numel)});
  f.sum->addValidated(u, static_cast<double>(m.examples));
  f.contributors.emplace_back(r.peer, s.id);
  f.edges.push_back(s.edge_id);
  if (f.edges.size() >= cfg_.splitfed_edges) complete(m.epoch, f);
}

void SplitCloudServer::complete(uint64_t epoch, FedEpoch& f) {
  f.done = true;
  if (f.edges.empty()) return;
  f.mean = f.sum->mean();
  f.sum.reset();
  ++stats_.averages;
  if (f.edges.size() < cfg_.splitfed_edges) {
    ++stats_.averages_short;
    note("SplitFed epoch " + std::to_string(epoch) + ": averaged " +
         std::to_string(f.edges.size()) + " of " + std::to_string(cfg_.splitfed_edges) +
         " edges (the others did not send in time)");
  }
  for (const auto& [peer, session] : f.contributors) {
    pr::SplitAverageMsg avg{session, epoch, static_cast<uint32_t>(f.edges.size()), f.mean};
    if (!socket_->send(peer, pr::encode(avg))) ++stats_.replies_dropped;
  }
}

void SplitCloudServer::saveCheckpoint() {
  since_checkpoint_ = 0;
  if (cfg_.checkpoint.empty()) return;
  saveCloudCheckpoint(cfg_.checkpoint, cfg_.fingerprint, stats_.steps, cloud_.top());
}

void SplitCloudServer::serve(const std::atomic<bool>& stop, uint64_t goodbyes) {
  while (!stop.load() && (goodbyes == 0 || stats_.goodbyes < goodbyes)) poll(milliseconds(200));
  saveCheckpoint();
}

// ---------------------------------------------------------------- edge

struct SplitEdgeClient::Answer {
  pr::SplitReplyMsg reply;
  uint64_t wire_bytes = 0;
};

SplitEdgeClient::SplitEdgeClient(transport::Context& context, SplitEdge& edge,
                                 EdgeClientConfig config)
    : edge_(edge), cfg_(std::move(config)) {
  if (cfg_.tries == 0) STARLING_THROW(ConfigError, "edge.tries must be at least 1");
  if (cfg_.step_timeout.count() <= 0)
    STARLING_THROW(ConfigError, "edge.step_timeout_ms must be positive");
  // No routing id of its own: the cloud's ZeroMQ names the connection, and a restarted edge's new
  // connection finds its session again by its hello (edge id, and under CURVE its key).
  // The goodbye must get out before the socket closes.
  if (cfg_.limits.linger_ms == 0) cfg_.limits.linger_ms = 500;
  socket_ =
      std::make_unique<transport::ClientSocket>(context, cfg_.cloud, cfg_.security, cfg_.limits);
}

SplitEdgeClient::~SplitEdgeClient() {
  try {
    bye();
  } catch (...) {
  }
}

void SplitEdgeClient::note(const std::string& s) const {
  if (cfg_.log) cfg_.log(s);
}

void SplitEdgeClient::bye() {
  if (said_bye_ || session_ == 0) return;
  said_bye_ = true;
  socket_->send(
      pr::encode(pr::ShutdownMsg{step_, "edge " + std::to_string(cfg_.edge_id) + " is done"}));
}

SplitEdgeClient::Wait SplitEdgeClient::await(
    std::span<const uint8_t> bytes, uint64_t expect_session, uint64_t expect_request,
    Steady::time_point deadline, const std::function<void(const protocol::RejectMsg&)>& refused,
    const std::function<bool(const transport::Received&)>& accept) {
  socket_->send(bytes);
  stats_.wire_up += bytes.size();
  while (Steady::now() < deadline) {
    auto r = socket_->receive(std::chrono::duration_cast<milliseconds>(deadline - Steady::now()) +
                              milliseconds(1));
    if (!r || !r->ok()) continue;
    stats_.wire_down += r->bytes().size();
    try {
      if (pr::peekKind(r->bytes()) == pr::MessageKind::kReject) {
        const auto rej = pr::decodeReject(r->bytes());
        if (rej.nonce != expect_session || rej.round != expect_request)
          continue;                               // a refusal of an earlier request
        if (rej.kind == pr::RejectKind::kBusy) {  // its upload memory is full: a moment, then again
          std::this_thread::sleep_for(milliseconds(100));
          return Wait::kAgain;
        }
        if (rej.kind ==
            pr::RejectKind::kNotRegistered) {  // the cloud restarted or closed our session
          note("the cloud does not know our session (" + rej.message + "): opening a new one");
          session_ = 0;
          return Wait::kAgain;
        }
        refused(rej);  // throws
      }
      if (accept(*r)) return Wait::kDone;
    } catch (const InputError& e) {
      note(std::string("a malformed message from the cloud: ") + e.what());
    }
  }
  return Wait::kTimeout;
}

void SplitEdgeClient::connect() {
  const auto hello =
      pr::encode(pr::SplitHelloMsg{cfg_.edge_id, cfg_.fingerprint, cfg_.up, cfg_.down});
  const auto refused = [&](const pr::RejectMsg& rej) {
    STARLING_THROW(ConfigError, "the cloud at ", cfg_.cloud, " refused edge ", cfg_.edge_id, " (",
                   errcName(static_cast<Errc>(rej.code)), "): ", rej.message);
  };
  const auto accept = [&](const transport::Received& r) {
    if (pr::peekKind(r.bytes()) != pr::MessageKind::kSplitReply) return false;
    const auto rep = pr::decodeSplitReply(r.bytes());
    if (rep.step != 0) return false;  // an answer to an old step
    session_ = rep.session;
    return true;
  };
  for (uint32_t t = 0; t < cfg_.tries; ++t) {
    session_ = 0;
    if (await(hello, 0, 0, Steady::now() + cfg_.step_timeout, refused, accept) == Wait::kDone &&
        session_ != 0) {
      ++stats_.sessions;
      note("session " + std::to_string(session_) + " with the cloud at " + cfg_.cloud);
      return;
    }
  }
  STARLING_THROW(IoError, "the cloud at ", cfg_.cloud, " did not answer edge ", cfg_.edge_id,
                 "'s hello in ", cfg_.tries, " tries of ", cfg_.step_timeout.count(), " ms");
}

SplitEdgeClient::Answer SplitEdgeClient::exchange(int kind, std::span<const uint8_t> labels,
                                                  std::vector<uint8_t> activations, size_t n) {
  STARLING_CHECK_ARG(n > 0 && n <= UINT32_MAX && labels.size() == n, "split edge: ", labels.size(),
                     " labels for ", n, " examples");
  ++step_;
  pr::SplitStepMsg m;
  m.step = step_;
  m.kind = static_cast<pr::SplitStepKind>(kind);
  m.examples = static_cast<uint32_t>(n);
  m.labels.assign(labels.begin(), labels.end());
  m.activations = std::move(activations);
  const auto refused = [&](const pr::RejectMsg& rej) {
    STARLING_THROW(InvalidArgument, "the cloud refused step ", step_, " of edge ", cfg_.edge_id,
                   " (", errcName(static_cast<Errc>(rej.code)), "): ", rej.message);
  };
  Answer out;
  const auto accept = [&](const transport::Received& r) {
    if (pr::peekKind(r.bytes()) != pr::MessageKind::kSplitReply) return false;
    auto rep = pr::decodeSplitReply(r.bytes());
    if (rep.session != session_ || rep.step != step_)
      return false;  // an answer to an earlier try or step
    out = Answer{std::move(rep), r.bytes().size()};
    return true;
  };
  for (uint32_t t = 0; t < cfg_.tries; ++t) {
    if (session_ == 0) connect();
    if (t > 0) ++stats_.resent;
    m.session = session_;
    const Wait w =
        await(pr::encode(m), session_, step_, Steady::now() + cfg_.step_timeout, refused, accept);
    if (w == Wait::kDone) return out;
    if (w == Wait::kTimeout)
      note("no answer to step " + std::to_string(step_) + " within " +
           std::to_string(cfg_.step_timeout.count()) + " ms: sending it again");
  }
  STARLING_THROW(IoError, "the cloud at ", cfg_.cloud, " did not answer step ", step_, " of edge ",
                 cfg_.edge_id, " in ", cfg_.tries, " tries of ", cfg_.step_timeout.count(), " ms");
}

EdgeStepResult SplitEdgeClient::train(std::span<const float> x, std::span<const uint8_t> labels,
                                      size_t n, bool train_bottom) {
  std::vector<uint8_t> up = edge_.forward(x, n);
  EdgeStepResult out;
  out.up_bytes = up.size();
  const int kind =
      static_cast<int>(train_bottom ? pr::SplitStepKind::kTrain : pr::SplitStepKind::kTrainTop);
  Answer a = exchange(kind, labels, std::move(up), n);
  out.loss = a.reply.loss;
  out.correct = a.reply.correct;
  out.cloud_seconds = a.reply.cloud_us * 1e-6;
  out.down_bytes = a.reply.gradient.size();
  if (train_bottom) {
    if (a.reply.gradient.empty())
      failInput(Errc::kMissingField, "the cloud's answer to step ", step_, " carries no gradient");
    edge_.backward(a.reply.gradient);  // InputError for a gradient that lies; the bottom unchanged
  }
  return out;
}

uint32_t SplitEdgeClient::average(uint64_t epoch, uint64_t examples) {
  STARLING_CHECK_ARG(epoch >= 1 && examples >= 1,
                     "split edge: SplitFed needs an epoch and examples");
  pr::SplitBottomMsg m{0, epoch, examples, {edge_.bottom().begin(), edge_.bottom().end()}};
  const auto refused = [&](const pr::RejectMsg& rej) {
    STARLING_THROW(InvalidArgument, "the cloud refused edge ", cfg_.edge_id, "'s bottom of epoch ",
                   epoch, " (", errcName(static_cast<Errc>(rej.code)), "): ", rej.message);
  };
  std::optional<pr::SplitAverageMsg> got;
  const auto accept = [&](const transport::Received& r) {
    if (pr::peekKind(r.bytes()) != pr::MessageKind::kSplitAverage) return false;
    auto avg = pr::decodeSplitAverage(r.bytes());
    if (avg.session != session_ || avg.epoch != epoch) return false;
    got = std::move(avg);
    return true;
  };
  const auto give_up = Steady::now() + cfg_.splitfed_wait;
  while (Steady::now() < give_up) {
    if (session_ == 0) connect();
    m.session = session_;
    // Sent again every step timeout (the cloud keeps one per edge and epoch) until the average
    // comes.
    if (await(pr::encode(m), session_, epoch, std::min(give_up, Steady::now() + cfg_.step_timeout),
              refused, accept) != Wait::kDone)
      continue;
    if (got->bottom.size() != edge_.bottom().size())
      failInput(Errc::kSizeMismatch, "the cloud's SplitFed average has ", got->bottom.size(),
                " parameters, the bottom ", edge_.bottom().size());
    edge_.setBottom(got->bottom);
    return got->edges;
  }
  STARLING_THROW(IoError, "no SplitFed average of epoch ", epoch, " from the cloud at ", cfg_.cloud,
                 " within ", cfg_.splitfed_wait.count(), " ms");
}

EdgeStepResult SplitEdgeClient::evaluate(std::span<const float> x, std::span<const uint8_t> labels,
                                         size_t n) {
  std::vector<uint8_t> up = edge_.forwardUncompressed(x, n);
  EdgeStepResult out;
  out.up_bytes = up.size();
  Answer a = exchange(static_cast<int>(pr::SplitStepKind::kEvaluate), labels, std::move(up), n);
  out.loss = a.reply.loss;
  out.correct = a.reply.correct;
  out.cloud_seconds = a.reply.cloud_us * 1e-6;
  return out;
}

EpochRecord runEdgeEpoch(SplitEdgeClient& client, const SplitTrainConfig& cfg, uint32_t epoch,
                         size_t shard, const data::Dataset& train, std::span<const size_t> idx,
                         const data::Dataset& test, std::span<const size_t> test_idx,
                         const std::function<void(size_t, size_t)>& progress) {
  STARLING_CHECK_ARG(!idx.empty(), "split edge: no training examples");
  const auto t0 = Steady::now();
  EpochRecord rec;
  rec.epoch = epoch;
  std::vector<size_t> order(idx.begin(), idx.end());
  RngStream rng(StreamKey{cfg.seed, epoch, shard, StreamPurpose::kTraining, 0});
  data::shuffleInPlace(std::span<size_t>(order), rng);
  std::vector<float> x;
  std::vector<uint8_t> y;
  const size_t steps = (order.size() + cfg.batch_size - 1) / cfg.batch_size;
  double loss_sum = 0;
  size_t correct = 0;
  for (size_t start = 0; start < order.size(); start += cfg.batch_size) {
    const size_t n = std::min<size_t>(cfg.batch_size, order.size() - start);
    gatherBatch(train, std::span<const size_t>(order).subspan(start, n), x, y);
    const EdgeStepResult r = client.train(x, y, n, cfg.train_bottom);
    loss_sum += r.loss;
    correct += r.correct;
    rec.uplink_bytes += r.up_bytes;
    rec.downlink_bytes += r.down_bytes;
    rec.cloud_seconds += r.cloud_seconds;
    ++rec.steps;
    if (progress) progress(rec.steps, steps);
  }
  rec.train_loss = loss_sum / static_cast<double>(rec.steps);
  rec.train_accuracy = static_cast<double>(correct) / static_cast<double>(order.size());
  if (cfg.splitfed && cfg.train_bottom) client.average(epoch, order.size());
  constexpr size_t kBatch = 256;
  double loss = 0;
  size_t right = 0;
  for (size_t start = 0; start < test_idx.size(); start += kBatch) {
    const size_t n = std::min(kBatch, test_idx.size() - start);
    gatherBatch(test, test_idx.subspan(start, n), x, y);
    const EdgeStepResult r = client.evaluate(x, y, n);
    loss += r.loss * static_cast<double>(n);
    right += r.correct;
    rec.eval_bytes += r.up_bytes;
  }
  if (!test_idx.empty()) {
    rec.test_loss = loss / static_cast<double>(test_idx.size());
    rec.test_accuracy = static_cast<double>(right) / static_cast<double>(test_idx.size());
  }
  rec.wall_seconds = std::chrono::duration<double>(Steady::now() - t0).count();
  return rec;
}

}  // namespace starling::split
