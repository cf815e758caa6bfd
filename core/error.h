#pragma once
// Starling's error model (docs/errors.md).
//
// - Exceptions derived from starling::Error are for what a caller can handle: bad input, bad
//   configuration, a peer that sent garbage, I/O. Their message says what was wrong and with which
//   values.
// - STARLING_ENFORCE(cond, ...) guards internal invariants; a failure is a Starling bug and throws
//   InternalError carrying the condition, the place and the values passed after it.
// - Across threads, errors travel as values (std::exception_ptr or an error struct), never by
//   unwinding through a thread boundary.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace starling {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed something unusable: mismatched shapes, an out-of-range option, non-finite data.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A configuration value (compressor options, optimizer options, ...) is wrong or unknown.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Reading or writing a file or socket failed, or stored bytes are corrupt.
class IoError : public Error {
 public:
  using Error::Error;
};

// An invariant inside Starling broke: a bug, reported with the values involved.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
[[noreturn]] void enforceFailed(const char* cond, const char* file, int line,
                                const std::string& msg);
}  // namespace detail

}  // namespace starling

// Throws ExceptionType with the streamed arguments as message.
#define STARLING_THROW(ExceptionType, ...) \
  throw ExceptionType(::starling::detail::concat(__VA_ARGS__))

// Checks a caller's input; throws InvalidArgument with the streamed message when cond is false.
#define STARLING_CHECK_ARG(cond, ...)                                      \
  do {                                                                     \
    if (!(cond)) STARLING_THROW(::starling::InvalidArgument, __VA_ARGS__); \
  } while (0)

// Checks an internal invariant; throws InternalError naming the condition and place.
#define STARLING_ENFORCE(cond, ...)                                                              \
  do {                                                                                           \
    if (!(cond))                                                                                 \
      ::starling::detail::enforceFailed(                                                         \
          #cond, __FILE__, __LINE__, ::starling::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
