#pragma once
// A thin RAII layer over LMDB for the client-state store (internal: included by .cc files only,
// so <lmdb.h> stays out of every public header). Every LMDB failure becomes an IoError carrying
// the operation, LMDB's own message (mdb_strerror: "MDB_MAP_FULL: Environment mapsize limit
// reached", "No space left on device", "Permission denied") and the folder.
#include <lmdb.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "core/error.h"

namespace starling::simulator::lmdb {

[[noreturn]] void fail(int rc, const std::filesystem::path& dir, const std::string& what);
inline void check(int rc, const std::filesystem::path& dir, const char* what) {
  if (rc != MDB_SUCCESS) fail(rc, dir, what);
}

inline MDB_val val(std::span<const uint8_t> b) {
  return MDB_val{b.size(), const_cast<uint8_t*>(b.data())};
}
inline std::span<const uint8_t> span(const MDB_val& v) {
  return {static_cast<const uint8_t*>(v.mv_data), v.mv_size};
}

// Client ids are stored big-endian, so LMDB's default memcmp order is numeric order and the file
// does not depend on the host's byte order for its keys.
struct Key {
  explicit Key(uint64_t id) {
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(id >> (56 - 8 * i));
  }
  MDB_val val() { return MDB_val{8, b}; }
  static uint64_t decode(const MDB_val& v) {
    uint64_t id = 0;
    for (size_t i = 0; i < v.mv_size && i < 8; ++i)
      id = (id << 8) | static_cast<const uint8_t*>(v.mv_data)[i];
    return id;
  }
  uint8_t b[8];
};

// An environment (one folder: data.mdb). Opened with MDB_NOLOCK (the owner serializes every
// transaction and holds its own exclusive lock on the folder), MDB_NOSYNC (commits reach the OS,
// durability comes from sync()), MDB_NOTLS (a read transaction is not tied to a thread) and
// MDB_NORDAHEAD (values are read one at a time; readahead would only fill the page cache).
class Env {
 public:
  Env(const std::filesystem::path& dir, uint64_t map_bytes, unsigned max_dbs);
  ~Env();
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  MDB_env* get() const { return env_; }
  const std::filesystem::path& dir() const { return dir_; }
  // Forces every committed transaction to disk (fsync).
  void sync();
  // Drops this process's mapping of the file's pages (the page cache keeps them): the read-only
  // map then stops counting towards the process's resident memory. Only while no transaction
  // holds a pointer into the map.
  void trimMapping();

 private:
  void findMapping();
  MDB_env* env_ = nullptr;
  void* map_ = nullptr;
  size_t map_len_ = 0;
  std::filesystem::path dir_;
};

// A write transaction, aborted by the destructor unless committed.
class WriteTxn {
 public:
  explicit WriteTxn(Env& env);
  ~WriteTxn();
  WriteTxn(const WriteTxn&) = delete;
  WriteTxn& operator=(const WriteTxn&) = delete;

  MDB_txn* get() const { return txn_; }
  MDB_dbi open(const char* name, unsigned flags);
  // false when absent; `out` points into the map (valid until the next change in this txn).
  bool get(MDB_dbi dbi, MDB_val key, MDB_val& out);
  void put(MDB_dbi dbi, MDB_val key, std::span<const uint8_t> value);
  // Reserves `size` bytes for `key` and returns where to write them.
  uint8_t* reserve(MDB_dbi dbi, MDB_val key, size_t size);
  // false when absent.
  bool del(MDB_dbi dbi, MDB_val key);
  void drop(MDB_dbi dbi);  // empties the database, keeps it
  void commit();

 private:
  Env& env_;
  MDB_txn* txn_ = nullptr;
};

// One read-only transaction handle, renewed for each read and reset after it (cheap: no
// allocation). The owner calls begin()/end() around each use.
class Reader {
 public:
  explicit Reader(Env& env) : env_(env) {}
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  void begin();
  void end();
  bool get(MDB_dbi dbi, MDB_val key, MDB_val& out);
  MDB_txn* get() const { return txn_; }

 private:
  Env& env_;
  MDB_txn* txn_ = nullptr;
  bool active_ = false;
};

}  // namespace starling::simulator::lmdb
