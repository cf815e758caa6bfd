#include "core/framed_file.h"

#include "core/bytes.h"
#include "core/error.h"
#include "core/file_io.h"

namespace starling {

namespace {
constexpr uint64_t kPrime = 0x100000001b3ull;
constexpr size_t kHeader = 24;  // magic, version, length, checksum

uint64_t le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

uint64_t foldWord(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * kPrime;
  return h;
}
}  // namespace

uint64_t frameChecksum(std::span<const uint8_t> payload) {
  // xxHash64's round on four lanes of 64-bit little-endian words (a rotation between the
  // multiplications, so that a change reaches every bit: a multiplication alone only carries
  // upwards, and two flips of a lane's top bit would cancel), then the lanes, the tail bytes and
  // the length folded by FNV-1a.
  constexpr uint64_t kP1 = 0x9e3779b185ebca87ull, kP2 = 0xc2b2ae3d27d4eb4full;
  const auto round = [&](uint64_t lane, uint64_t w) {
    lane += w * kP2;
    lane = (lane << 31) | (lane >> 33);
    return lane * kP1;
  };
  uint64_t lane[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  const size_t n = payload.size(), blocks = n / 32;
  const uint8_t* p = payload.data();
  for (size_t b = 0; b < blocks; ++b, p += 32)
    for (int i = 0; i < 4; ++i) lane[i] = round(lane[i], le64(p + 8 * i));
  uint64_t h = 1469598103934665603ull;
  for (uint64_t l : lane) h = foldWord(h, l);
  for (size_t i = blocks * 32; i < n; ++i) h = (h ^ payload[i]) * kPrime;
  return foldWord(h, n);
}

namespace {
std::vector<uint8_t> header(const FileFormat& f, std::span<const uint8_t> payload) {
  std::vector<uint8_t> out;
  ByteWriter w(out);
  w.u32(f.magic);
  w.u32(f.current);
  w.u64(payload.size());
  w.u64(frameChecksum(payload));
  return out;
}
}  // namespace

std::vector<uint8_t> framed(const FileFormat& f, std::span<const uint8_t> payload) {
  std::vector<uint8_t> out = header(f, payload);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void writeFramed(const std::filesystem::path& path, const FileFormat& f,
                 std::span<const uint8_t> payload, unsigned mode) {
  const std::vector<uint8_t> head = header(f, payload);
  const std::span<const uint8_t> parts[2] = {head, payload};  // the payload is not copied
  writeFileAtomic(path, std::span<const std::span<const uint8_t>>(parts), mode);
}

bool hasMagic(std::span<const uint8_t> bytes, uint32_t magic) {
  if (bytes.size() < 4) return false;
  ByteReader r(bytes.first(4), "");
  return r.u32() == magic;
}

Unframed unframe(const FileFormat& f, std::span<const uint8_t> bytes, const std::string& what) {
  ByteReader r(bytes, what);
  if (!hasMagic(bytes, f.magic)) r.fail("not a ", f.name);
  r.u32();
  Unframed u;
  u.version = r.u32();
  if (u.version > f.current)
    r.fail("format version ", u.version, " of the ", f.name, " is newer than this build reads (",
           f.oldest, " to ", f.current, "): use the build that wrote it");
  if (u.version < f.oldest)
    r.fail("format version ", u.version, " of the ", f.name, " is older than this build reads (",
           f.oldest, " to ", f.current,
           "): finish its run with the build that wrote it, or start over without the file");
  if (u.version < f.framed_since) {
    u.payload = bytes.subspan(8);
    return u;
  }
  const uint64_t length = r.u64(), sum = r.u64();
  if (length != r.remaining())
    r.fail(length > r.remaining() ? "truncated" : "trailing bytes", ": the frame holds ", length,
           " bytes of ", f.name, " after its 24-byte header, the file ", bytes.size(),
           " bytes in all", " (a partial copy?): restore the file, or start over without it");
  u.payload = bytes.subspan(kHeader);
  u.framed = true;
  if (frameChecksum(u.payload) != sum)
    r.fail(
        "damaged: its checksum differs from the frame's: restore the file, or start over "
        "without it");
  return u;
}

}  // namespace starling
