#include <zmq.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "transport/key_text.h"
#include "transport/keys.h"

namespace starling::transport {

namespace fs = std::filesystem;

namespace {

std::string binaryKey(std::string_view z85) {
  const std::string z(z85);
  std::string bin(32, '\0');
  if (z.size() != 40 || !zmq_z85_decode(reinterpret_cast<uint8_t*>(bin.data()), z.c_str()))
    return {};
  return bin;
}

// Lines `<id> <Z85 public key>`.
void loadListFile(AllowList& list, const fs::path& path) {
  const std::string where = path.string();
  const std::string text = detail::readSmallFile(path);
  std::string_view rest = text;
  int line_no = 0;
  while (!rest.empty()) {
    ++line_no;
    const size_t nl = rest.find('\n');
    const std::string_view line = detail::trim(rest.substr(0, nl));
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    if (line.empty() || line.front() == '#') continue;
    const size_t sp = line.find_first_of(" \t");
    const auto id = detail::parseU64(line.substr(0, sp));
    const std::string_view key =
        sp == std::string_view::npos ? std::string_view{} : detail::trim(line.substr(sp));
    if (!id || !isZ85Key(key))
      STARLING_THROW(ConfigError, where, ":", line_no,
                     ": expected `<id> <40-character Z85 public key>`, got \"", line, "\"");
    list.add(*id, key, where + ":" + std::to_string(line_no));
  }
}

}  // namespace

AllowList AllowList::load(const fs::path& path) {
  AllowList list;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".key" && e.is_regular_file(ec)) files.push_back(e.path());
    if (ec) STARLING_THROW(IoError, "cannot list ", path.string(), ": ", ec.message());
    std::sort(files.begin(),
              files.end());  // deterministic order, so errors name files the same way
    for (const auto& f : files) {
      const KeyFile k = loadKeyFile(f);
      if (k.public_key.empty())
        STARLING_THROW(ConfigError, f.string(),
                       ": an authority's key file, not a client's (keep it out of the allow-list "
                       "folder)");
      if (!k.id)
        STARLING_THROW(ConfigError, f.string(),
                       ": no `id = N` line; every *.key file in an allow-list folder must carry "
                       "the client's id "
                       "(keep the server's own key files elsewhere)");
      list.add(*k.id, k.public_key, f.string());
    }
  } else if (fs::exists(path, ec)) {
    loadListFile(list, path);
  } else {
    STARLING_THROW(ConfigError, "allow-list ", path.string(), " does not exist");
  }
  if (list.size() == 0)
    STARLING_THROW(ConfigError, "allow-list ", path.string(),
                   " admits no client (no *.key files or lines)");
  return list;
}

void AllowList::add(uint64_t id, std::string_view z85_public_key, std::string origin) {
  std::string bin = binaryKey(z85_public_key);
  if (bin.empty()) STARLING_THROW(ConfigError, origin, ": not a 40-character Z85 public key");
  if (auto it = by_key_.find(bin); it != by_key_.end())
    STARLING_THROW(ConfigError, "the same public key is listed twice: ", it->second.origin, " (id ",
                   it->second.id, ") and ", origin, " (id ", id, ")");
  if (auto it = id_origin_.find(id); it != id_origin_.end())
    STARLING_THROW(ConfigError, "client id ", id, " is listed twice: ", it->second, " and ",
                   origin);
  id_origin_.emplace(id, origin);
  by_key_.emplace(std::move(bin), Entry{id, std::move(origin)});
}

std::optional<uint64_t> AllowList::find(std::string_view key) const {
  std::string bin;
  if (key.size() == 32)
    bin = std::string(key);
  else if (key.size() == 40)
    bin = binaryKey(key);
  if (bin.empty()) return std::nullopt;
  const auto it = by_key_.find(bin);
  if (it == by_key_.end()) return std::nullopt;
  return it->second.id;
}

std::vector<uint64_t> AllowList::ids() const {
  std::vector<uint64_t> out;
  out.reserve(id_origin_.size());
  for (const auto& [id, origin] : id_origin_) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

std::string AllowList::origin(uint64_t id) const {
  const auto it = id_origin_.find(id);
  return it == id_origin_.end() ? std::string() : it->second;
}

std::string AllowList::keyOf(uint64_t id) const {
  for (const auto& [key, e] : by_key_)
    if (e.id == id) return key;
  return {};
}

bool AllowList::remove(uint64_t id) {
  if (!id_origin_.erase(id)) return false;
  std::erase_if(by_key_, [id](const auto& kv) { return kv.second.id == id; });
  return true;
}

}  // namespace starling::transport
