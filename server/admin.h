#pragma once
// Administration of a running root, or edge aggregator, without a restart: the commands
// starling-admin sends over the control socket (ops/control_socket.h), answered on the rounds'
// thread, each logged with who asked (the caller's uid and pid, from the kernel). An edge
// aggregator takes status, reload and revoke for its own clients (its security.clients); drain,
// pause and resume are the root's (the aggregator relays the root's rounds).
//
//   status          one JSON object: round, paused, parked (paused and no round running),
//                   draining, clients registered and online, the allow-list's size, the revoked
//                   clients
//   reload          reads security.clients again: keys added are admitted from their next
//                   handshake; keys gone are revoked (below); a key replaced takes over its id
//                   (the old key's connections closed, ZmqFleet::replacedKey)
//   revoke ID       client ID: its registration forgotten, its open task failed (an update in
//                   flight dropped and counted), every later message refused (kRevoked; its
//                   client stops), its connections closed a second later, its handshakes refused
//                   from then on; until the root restarts (remove its key file too, or the
//                   restart admits it again)
//   drain           finish the round in progress, then stop (the checkpoint is the last round's);
//                   a round still waiting for its clients is not in progress: it stops at once
//   pause, resume   no new round starts while paused (heartbeats are answered, commands taken);
//                   in asynchronous rounds no task is handed out (the open ones finish, their
//                   updates taken; parked once none is open)
//
// What a command cannot do is an answer beginning "error: ", and changes nothing.
#include <cstdint>
#include <memory>
#include <string>

#include "ops/control_socket.h"

namespace spdlog {
class logger;
}
namespace starling::transport {
class AllowList;
}

namespace starling::server {

class ZmqFleet;

class Admin {
 public:
  // `allow_path`: security.clients (reload reads it; empty for an insecure root, where reload and
  // revoke are refused); `asynchronous`: buffered rounds (drain, pause and resume act on the
  // fleet's hand-outs); `relays`: an edge aggregator's (drain, pause and resume refused).
  Admin(ZmqFleet& fleet, std::string allow_path, bool asynchronous,
        std::shared_ptr<spdlog::logger> log, bool relays = false);

  // One command line; the answer to send back.
  std::string handle(const std::string& line, const ops::Caller& caller);

  // For the program's loop.
  bool paused() const { return paused_; }
  bool draining() const { return draining_; }
  void setRound(uint64_t round) { round_ = round; }
  // The loop waits, paused, before round_ (status says "parked": no round runs).
  void setParked(bool parked) { parked_ = parked; }

 private:
  std::string status() const;
  std::string reload(const ops::Caller& caller);
  std::string revoke(uint64_t id, const ops::Caller& caller);
  ZmqFleet& fleet_;
  std::string allow_path_;
  bool async_;
  std::shared_ptr<spdlog::logger> log_;
  bool relays_;
  std::shared_ptr<const transport::AllowList> allow_;  // what the fleet admits now
  bool paused_ = false, draining_ = false, parked_ = false;
  uint64_t round_ = 0;
};

}  // namespace starling::server
