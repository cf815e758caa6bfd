#pragma once
// One input file of a data set, gzip-compressed or plain (zlib reads a file without a gzip header
// transparently): the reader the IDX and CSV loaders share. Internal to data/.
//
// Every failure is an IoError whose message starts with the path: missing, a directory,
// unreadable, a corrupt gzip stream, and (through truncated() / expectEnd()) data that ends early
// or goes on past what a header announced.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

struct gzFile_s;

namespace starling::data::detail {

inline constexpr size_t kReadChunk = size_t{1} << 16;  // read granularity: memory follows bytes

class GzFile {
 public:
  explicit GzFile(std::string path);
  ~GzFile();
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t offset() const { return offset_; }  // bytes read so far (after decompression)

  // Reads up to n bytes; fewer only at the end of the data. A corrupt gzip stream throws; a gzip
  // stream cut short reads as an early end here and is reported by endState().
  size_t read(uint8_t* dst, size_t n);

  // Why the data ended: "" after a complete file, otherwise the reason (a gzip stream without its
  // end, which zlib reports as Z_BUF_ERROR rather than as a read error).
  std::string endState();

  // Reads exactly n bytes or throws, naming `what` was being read.
  void readExactly(uint8_t* dst, size_t n, const std::string& what);

  // Throws: reading `what` needed `need` bytes and only `got` remained.
  [[noreturn]] void truncated(uint64_t got, uint64_t need, const std::string& what);

  // Checks that nothing follows the `announced` bytes a header promised.
  void expectEnd(uint64_t announced);

 private:
  std::string zlibMessage(const char* msg) const;  // gzerror() without our path in front

  std::string path_;
  std::unique_ptr<gzFile_s, int (*)(gzFile_s*)> f_;
  uint64_t offset_ = 0;
};

}  // namespace starling::data::detail
