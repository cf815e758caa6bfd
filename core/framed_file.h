#pragma once
// One frame for Starling's own binary files: the round engine's checkpoint and its optimizer shard
// files, the asynchronous root's and the asynchronous simulator's checkpoints, the simulator's
// client homes, a client's state file, and starling-split's cloud checkpoint and pre-trained
// model. Each format keeps its own magic and versions; the frame is the same for all:
//
//   magic (u32) | version (u32) | payload length (u64) | payload checksum (u64) | payload
//
// little-endian, the checksum frameChecksum() below. A cut file (a partial copy) or a damaged one
// (a flipped bit) is refused with what to do, where a bare layout could have resumed from wrong
// values. A format that took the frame at version `framed_since` still reads its versions from
// `oldest` on: magic, version, then its fields unframed (no length, no checksum).
//
// The asynchronous root's journal is appended to, so it is not one frame: its records each carry
// their length and an FNV-1a checksum (server/async_root.cc).
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace starling {

struct FileFormat {
  uint32_t magic = 0;
  const char* name = "";  // in errors: "not a <name>"
  uint32_t oldest = 1;    // the oldest version read
  uint32_t framed_since = 1;
  uint32_t current = 1;  // the version written
};

// A checksum of `payload` for accidental damage (not a MAC): xxHash64's round on four lanes of
// 64-bit little-endian words, the lanes, the tail bytes and the length then folded by FNV-1a. The
// same value on every CPU.
uint64_t frameChecksum(std::span<const uint8_t> payload);

// The bytes of a file of format `f`: the frame of `payload` at version f.current.
std::vector<uint8_t> framed(const FileFormat& f, std::span<const uint8_t> payload);

// framed(), written with writeFileAtomic (core/file_io.h).
void writeFramed(const std::filesystem::path& path, const FileFormat& f,
                 std::span<const uint8_t> payload, unsigned mode = 0644);

struct Unframed {
  uint32_t version = 0;
  std::span<const uint8_t> payload;  // a view into the bytes given: after the version when the
                                     // version is older than f.framed_since
  bool framed = false;
};

// The version and payload of `bytes`, checked: f's magic, a version from f.oldest to f.current,
// and from f.framed_since on the payload's length and checksum. IoError naming `what` (the file)
// and saying what to do otherwise.
Unframed unframe(const FileFormat& f, std::span<const uint8_t> bytes, const std::string& what);

// Whether `bytes` begin with `magic` (a reader that tells formats apart).
bool hasMagic(std::span<const uint8_t> bytes, uint32_t magic);

}  // namespace starling
