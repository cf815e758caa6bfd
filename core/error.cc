#include "core/error.h"

namespace starling::detail {

void enforceFailed(const char* cond, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << "internal error: " << cond << " failed at " << file << ":" << line;
  if (!msg.empty()) os << ": " << msg;
  throw InternalError(os.str());
}

}  // namespace starling::detail
