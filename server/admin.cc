#include "server/admin.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "server/zmq_fleet.h"
#include "transport/keys.h"

namespace starling::server {

namespace {

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

bool parseId(const std::string& s, uint64_t& id) {
  if (s.empty() || s.size() > 20 || s.find_first_not_of("0123456789") != std::string::npos)
    return false;
  try {
    id = std::stoull(s);
  } catch (...) {
    return false;
  }
  return true;
}

}  // namespace

Admin::Admin(ZmqFleet& fleet, std::string allow_path, bool asynchronous,
             std::shared_ptr<spdlog::logger> log, bool relays)
    : fleet_(fleet),
      allow_path_(std::move(allow_path)),
      async_(asynchronous),
      log_(std::move(log)),
      relays_(relays) {
  if (!allow_path_.empty()) allow_ = fleet_.allowList();  // the one the ZAP handler admits by
  if (!allow_path_.empty() && !allow_)
    STARLING_THROW(ConfigError, "admin: the server has no allow-list (is it insecure?)");
}

std::string Admin::handle(const std::string& line, const ops::Caller& caller) {
  const auto w = words(line);
  const std::string who = caller.describe();
  const auto refused = [&](const std::string& why) {
    log_->warn("admin: refused '{}' from {}: {}", line.substr(0, 80), who, why);
    return "error: " + why;
  };
  if (w.empty()) return refused("no command (status, reload, revoke ID, drain, pause, resume)");
  const std::string& cmd = w[0];
  if (cmd == "status" && w.size() == 1) return status();
  if (cmd == "reload" && w.size() == 1) {
    if (allow_path_.empty()) return refused("an insecure root has no allow-list to reload");
    try {
      return reload(caller);
    } catch (const Error& e) {
      return refused(std::string("the allow-list was not changed: ") + e.what());
    }
  }
  if (cmd == "revoke" && w.size() == 2) {
    uint64_t id = 0;
    if (!parseId(w[1], id)) return refused("revoke takes a client id (a number)");
    if (allow_path_.empty())
      return refused("revoking a client needs CURVE: an insecure root cannot tell who sends");
    return revoke(id, caller);
  }
  if ((cmd == "drain" || cmd == "pause" || cmd == "resume") && w.size() == 1) {
    if (relays_)
      return refused(cmd +
                     " is the root's: an edge aggregator relays the root's rounds (stop it with "
                     "SIGTERM; its clients wait for it)");
    if (async_ && cmd == "drain") {
      draining_ = true;
      fleet_.drainWaits();
      log_->warn(
          "admin: drain asked by {} at step {}: no new task; the open ones finish, then the root "
          "stops",
          who, round_);
      return "draining: no task is handed out; the open ones finish (each at most its deadline), "
             "their updates kept in the checkpoint's journal (lost without state.checkpoint), "
             "then the root stops";
    }
    if (async_) {
      // Buffered rounds have no boundary to wait at: pause hands out no task, the open ones
      // finish (their updates taken, a step made when the buffer fills); resume hands out again.
      paused_ = cmd == "pause";
      fleet_.holdTasks(paused_);
      log_->warn("admin: {} by {} (step {})", paused_ ? "paused" : "resumed", who, round_);
      return paused_ ? "paused: no task is handed out until resume (the open ones finish)"
                     : "resumed";
    }
    if (cmd == "drain") {
      draining_ = true;
      fleet_.drainWaits();
      log_->warn("admin: drain asked by {}: round {} finishes, then the root stops", who, round_);
      return "draining: round " + std::to_string(round_) + " finishes, then the root stops";
    }
    paused_ = cmd == "pause";
    log_->warn("admin: {} by {} (round {})", paused_ ? "paused" : "resumed", who, round_);
    return paused_ ? "paused: no round starts until resume (the one running finishes)" : "resumed";
  }
  return refused("unknown command or arguments: status, reload, revoke ID, drain, pause, resume");
}

std::string Admin::status() const {
  size_t n = 0;
  std::ostringstream o;
  o << "{\"role\":\"" << (relays_ ? "aggregator" : "root")
    << "\",\"round\":" << std::max<uint64_t>(round_, fleet_.progress().round)
    << ",\"paused\":" << (paused_ ? "true" : "false") << ",\"parked\":"
    << ((async_ ? paused_ && fleet_.openTasks() == 0 : parked_) ? "true" : "false")
    << ",\"draining\":" << (draining_ ? "true" : "false")
    << ",\"registered\":" << fleet_.registeredCount() << ",\"online\":" << fleet_.onlineCount()
    << ",\"allowed\":" << (allow_ ? allow_->size() : 0) << ",\"revoked\":[";
  for (uint64_t id : fleet_.revokedIds()) o << (n++ ? "," : "") << id;
  o << "],\"secure\":" << (fleet_.secure() ? "true" : "false") << "}";
  return o.str();
}

std::string Admin::reload(const ops::Caller& caller) {
  auto next = std::make_shared<transport::AllowList>(transport::AllowList::load(allow_path_));
  // A revoked client stays revoked whatever the folder holds (until the root restarts).
  for (uint64_t id : fleet_.revokedIds()) next->remove(id);
  std::vector<uint64_t> added, removed, replaced;
  for (uint64_t id : next->ids()) {
    if (!allow_->has(id))
      added.push_back(id);
    else if (next->keyOf(id) != allow_->keyOf(id))
      replaced.push_back(id);  // the old key's connections are closed once the new list is in
  }
  for (uint64_t id : allow_->ids())
    if (!next->has(id) && !fleet_.revoked(id)) removed.push_back(id);
  std::shared_ptr<const transport::AllowList> now = next;
  fleet_.setAllowList(now);
  allow_ = now;
  for (uint64_t id : removed) fleet_.revoke(id);
  // ZAP names a connection by its id, not its key: the old key's connections are closed (what
  // they queued dropped unread), so only the new key speaks as the client from now on.
  for (uint64_t id : replaced) (void)fleet_.replacedKey(id);
  const auto list = [](const std::vector<uint64_t>& v) {
    std::string s;
    for (uint64_t id : v) {
      if (!s.empty()) s += ',';
      s += std::to_string(id);
    }
    return s.empty() ? std::string("none") : s;
  };
  log_->warn(
      "admin: allow-list reloaded from {} by {}: {} keys; admitted {}; revoked {}; keys "
      "replaced {}",
      allow_path_, caller.describe(), now->size(), list(added), list(removed), list(replaced));
  return "reloaded: " + std::to_string(now->size()) + " keys; admitted " + list(added) +
         "; revoked " + list(removed) + "; keys replaced " + list(replaced);
}

std::string Admin::revoke(uint64_t id, const ops::Caller& caller) {
  if (fleet_.revoked(id)) return "client " + std::to_string(id) + " was revoked already";
  if (!allow_->has(id)) return "error: client " + std::to_string(id) + " is not on the allow-list";
  auto next = std::make_shared<transport::AllowList>(*allow_);
  next->remove(id);
  if (next->size() == 0) return "error: revoking the last listed client would admit no one";
  fleet_.setAllowList(next);
  allow_ = next;
  const uint64_t in_flight = fleet_.revokedInFlight();
  fleet_.revoke(id);
  const bool dropped = fleet_.revokedInFlight() > in_flight;
  log_->warn("admin: client {} revoked by {}{}; its connections close within a second", id,
             caller.describe(),
             dropped ? "; its open task failed (an answer on its way will be refused)" : "");
  return "revoked client " + std::to_string(id) +
         (dropped ? " (its open task failed)" : " (it held no open task)") +
         "; its connections close within a second";
}

}  // namespace starling::server
