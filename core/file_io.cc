#include "core/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "core/error.h"

namespace starling {

namespace {

[[noreturn]] void ioFail(const std::filesystem::path& p, const char* what) {
  STARLING_THROW(IoError, what, " ", p.string(), ": ", std::strerror(errno));
}

void writeAll(int fd, std::span<const uint8_t> bytes, const std::filesystem::path& p) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      ioFail(p, "cannot write");
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

namespace {
// A rename is durable only once its folder is.
void syncFolder(const std::filesystem::path& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}
}  // namespace

void writeFileAtomic(const std::filesystem::path& path, std::span<const uint8_t> bytes,
                     unsigned mode) {
  const std::span<const uint8_t> parts[1] = {bytes};
  writeFileAtomic(path, std::span<const std::span<const uint8_t>>(parts), mode);
}

void writeFileAtomic(const std::filesystem::path& path,
                     std::span<const std::span<const uint8_t>> parts, unsigned mode) {
  const std::filesystem::path dir =
      path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  // A unique temporary name: several writers (threads, processes) may target one folder.
  std::random_device rd;
  const std::filesystem::path tmp = dir / (path.filename().string() + ".tmp." +
                                           std::to_string(::getpid()) + "." + std::to_string(rd()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) ioFail(tmp, "cannot create");
  try {
    for (const auto& bytes : parts) writeAll(fd, bytes, tmp);
    if (::fsync(fd) != 0) ioFail(tmp, "cannot fsync");
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    ioFail(tmp, "cannot close");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    ioFail(path, "cannot rename into");
  }
  syncFolder(dir);
}

void renameDurable(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) ioFail(from, "cannot rename into its final name");
  syncFolder(to.has_parent_path() ? to.parent_path() : std::filesystem::path("."));
}

std::vector<uint8_t> readFile(const std::filesystem::path& path, uint64_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ioFail(path, "cannot open");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  if (size > max_bytes)
    STARLING_THROW(IoError, path.string(), " is ", size, " bytes, more than the ", max_bytes,
                   " allowed");
  in.seekg(0);
  std::vector<uint8_t> out(size);
  if (size && !in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(size)))
    ioFail(path, "cannot read");
  return out;
}

}  // namespace starling
