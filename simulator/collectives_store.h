#pragma once
// Internal to simulator/ (not for other modules: it includes c10d): the rendezvous shared by the
// Gloo and NCCL groups, and the conversion of LibTorch/Gloo exceptions into Starling's IoError.
// Included only by simulator/collectives_gloo.cc and simulator/nccl_collectives.cc.
#include <chrono>
#include <exception>
#include <string>
#include <string_view>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "simulator/launch.h"

namespace starling::simulator::detail {

// A c10d TCPStore: rank 0 hosts it on info.master_port (c10d's server listens on every interface
// of that port; LibTorch 1.13 has no bind address) and every rank, rank 0 included, connects to
// info.master_addr:info.master_port. Waits up to `timeout` for all info.world_size ranks to
// connect. Keys are prefixed with "starling/<group>/" so that groups sharing a store do not mix.
// IoError naming the address, port, rank and cause on failure.
c10::intrusive_ptr<c10d::Store> connectStore(const LaunchInfo& info,
                                             std::chrono::milliseconds timeout,
                                             std::string_view group);

// Every rank must pass the same value; rank 0 publishes its own under `key`, the others compare
// (ConfigError naming the key and both values if they differ). Used for options that, if they
// differed between ranks, would make the ranks' collectives disagree on sizes and hang.
void agreeOnValue(c10d::Store& store, int rank, const std::string& key, const std::string& value);

// The message of an exception from LibTorch, Gloo or the standard library, without c10's C++
// backtrace (c10::Error::what() appends one).
std::string describe(const std::exception& e);

}  // namespace starling::simulator::detail
