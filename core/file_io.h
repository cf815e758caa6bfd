#pragma once
// Whole-file reads and crash-safe writes, for checkpoints, client state and key files.
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace starling {

// Writes `bytes` to `path` so that after a crash at any point the file holds either its old
// content or the new one, never a mix: write a temporary file beside it, fsync it, rename it over
// `path`, fsync the folder. `mode` is the new file's permission bits. Throws IoError.
void writeFileAtomic(const std::filesystem::path& path, std::span<const uint8_t> bytes,
                     unsigned mode = 0644);
// The same, the file being `parts` one after another.
void writeFileAtomic(const std::filesystem::path& path,
                     std::span<const std::span<const uint8_t>> parts, unsigned mode = 0644);

// Renames `from` over `to` (atomic on one file system) and fsyncs the folder, so that the rename
// survives a crash. Throws IoError.
void renameDurable(const std::filesystem::path& from, const std::filesystem::path& to);

// The whole file. Throws IoError if it cannot be read or is larger than `max_bytes`.
std::vector<uint8_t> readFile(const std::filesystem::path& path, uint64_t max_bytes);

}  // namespace starling
