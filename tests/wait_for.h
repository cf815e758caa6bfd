#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace starling::testing {

// Waits for an event the test cannot be told of directly (a file written by another process, a
// counter moved by another thread): checks `pred` every `every` until it holds (true) or `timeout`
// passes (false). Never a fixed sleep: the test goes on the moment the event has happened.
inline bool waitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout,
                    std::chrono::milliseconds every = std::chrono::milliseconds(20)) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(every);
  }
  return true;
}

}  // namespace starling::testing
