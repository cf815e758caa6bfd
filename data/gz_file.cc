#include "data/gz_file.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace starling::data::detail {

GzFile::GzFile(std::string path) : path_(std::move(path)), f_(nullptr, gzclose) {
  std::error_code ec;
  const auto st = std::filesystem::status(path_, ec);
  if (!std::filesystem::exists(st)) STARLING_THROW(IoError, path_, ": no such file");
  if (std::filesystem::is_directory(st))
    STARLING_THROW(IoError, path_, ": is a directory, not a data file");
  errno = 0;
  f_.reset(gzopen(path_.c_str(), "rb"));
  if (!f_)
    STARLING_THROW(IoError, path_,
                   ": cannot open: ", errno ? std::strerror(errno) : "out of memory");
  gzbuffer(f_.get(), 1u << 17);  // fewer, larger reads; must precede the first read
}

GzFile::~GzFile() = default;

size_t GzFile::read(uint8_t* dst, size_t n) {
  size_t got = 0;
  while (got < n) {
    const unsigned want = static_cast<unsigned>(std::min<size_t>(n - got, kReadChunk));
    const int r = gzread(f_.get(), dst + got, want);
    if (r < 0) {
      int errnum = 0;
      const char* msg = gzerror(f_.get(), &errnum);
      if (errnum == Z_ERRNO)
        STARLING_THROW(IoError, path_, ": read failed: ", std::strerror(errno));
      STARLING_THROW(IoError, path_, ": corrupt gzip stream (zlib: ", zlibMessage(msg), ")");
    }
    got += static_cast<size_t>(r);
    offset_ += static_cast<uint64_t>(r);
    if (static_cast<unsigned>(r) < want) break;
  }
  return got;
}

std::string GzFile::endState() {
  int errnum = 0;
  const char* msg = gzerror(f_.get(), &errnum);
  if (errnum == Z_BUF_ERROR) return "the gzip stream is truncated (zlib: " + zlibMessage(msg) + ")";
  return {};
}

void GzFile::readExactly(uint8_t* dst, size_t n, const std::string& what) {
  const size_t got = read(dst, n);
  if (got < n) truncated(got, n, what);
}

void GzFile::truncated(uint64_t got, uint64_t need, const std::string& what) {
  const std::string why = endState();
  STARLING_THROW(IoError, path_, ": truncated: reading ", what, " needs ", need, " bytes but only ",
                 got, " remain (the data ends at byte ", offset_, ")", why.empty() ? "" : "; ", why,
                 "; the header does not match the file size");
}

void GzFile::expectEnd(uint64_t announced) {
  uint8_t probe[kReadChunk];
  uint64_t extra = 0;
  // Count what follows, up to a bound: a gzip bomb must not keep us here.
  for (size_t got; extra < (uint64_t{1} << 24) && (got = read(probe, sizeof probe)) > 0;)
    extra += got;
  if (extra > 0)
    STARLING_THROW(IoError, path_, ": ", extra >= (uint64_t{1} << 24) ? "at least " : "", extra,
                   " bytes follow the ", announced,
                   " bytes of data the header announces (the header does not match the file size)");
  const std::string why = endState();
  if (!why.empty()) STARLING_THROW(IoError, path_, ": ", why);
}

std::string GzFile::zlibMessage(const char* msg) const {
  std::string m = msg ? msg : "unknown error";
  const std::string prefix = path_ + ": ";
  if (m.compare(0, prefix.size(), prefix) == 0) m.erase(0, prefix.size());
  return m;
}

}  // namespace starling::data::detail
