#pragma once
// What a log line says besides its text, for programs that write their logs as JSON
// (`log.format = json`, apps/common.h): the round, the peer and the error code a line is about,
// set on the thread that logs for the scope of the work (ScopedLogFields), read by the formatter.
// Best effort by design: a line logged where none is set carries none of them.
#include <cstdint>
#include <optional>

#include "core/input_error.h"

namespace starling {

struct LogFields {
  std::optional<uint64_t> round;  // the round (or asynchronous step) in progress
  std::optional<uint64_t> peer;   // the client or aggregator id the line is about
  std::optional<Errc> code;       // the error code of a refusal
};

// This thread's fields.
inline LogFields& logFields() {
  thread_local LogFields fields;
  return fields;
}

// Sets some of this thread's fields for its lifetime, then puts back what was there.
class ScopedLogFields {
 public:
  ScopedLogFields(std::optional<uint64_t> round, std::optional<uint64_t> peer,
                  std::optional<Errc> code = std::nullopt)
      : saved_(logFields()) {
    LogFields& f = logFields();
    if (round) f.round = round;
    if (peer) f.peer = peer;
    if (code) f.code = code;
  }
  ~ScopedLogFields() { logFields() = saved_; }
  ScopedLogFields(const ScopedLogFields&) = delete;
  ScopedLogFields& operator=(const ScopedLogFields&) = delete;

 private:
  LogFields saved_;
};

}  // namespace starling
