#include "simulator/lmdb_env.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstdio>
#include <fstream>

namespace starling::simulator::lmdb {

void fail(int rc, const std::filesystem::path& dir, const std::string& what) {
  std::string hint;
  if (rc == MDB_MAP_FULL) hint = " (raise the store's map_bytes: it bounds the spill file's size)";
  STARLING_THROW(IoError, "client-state store ", dir.string(), ": ", what, ": ", mdb_strerror(rc),
                 hint);
}

Env::Env(const std::filesystem::path& dir, uint64_t map_bytes, unsigned max_dbs) : dir_(dir) {
  check(mdb_env_create(&env_), dir_, "mdb_env_create");
  try {
    check(mdb_env_set_mapsize(env_, static_cast<size_t>(map_bytes)), dir_, "setting the map size");
    check(mdb_env_set_maxdbs(env_, max_dbs), dir_, "setting the number of databases");
    check(
        mdb_env_open(env_, dir_.c_str(), MDB_NOLOCK | MDB_NOSYNC | MDB_NOTLS | MDB_NORDAHEAD, 0600),
        dir_, "opening the environment");
    findMapping();
  } catch (...) {
    mdb_env_close(env_);
    throw;
  }
}

Env::~Env() { mdb_env_close(env_); }

void Env::sync() { check(mdb_env_sync(env_, 1), dir_, "syncing to disk"); }

void Env::findMapping() {
  // LMDB does not export where it mapped the file (mdb_env_info's me_mapaddr is only set with
  // MDB_FIXEDMAP), so find the mapping of data.mdb's inode in /proc/self/maps. Not found: no trim.
  struct stat st;
  if (::stat((dir_ / "data.mdb").c_str(), &st) != 0) return;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long start = 0, end = 0, offset = 0, inode = 0;
    char perms[8] = {};
    char dev[32] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %lx %31s %lu", &start, &end, perms, &offset, dev,
                    &inode) != 6)
      continue;
    if (inode != static_cast<unsigned long>(st.st_ino) || offset != 0) continue;
    unsigned major = 0, minor = 0;
    if (std::sscanf(dev, "%x:%x", &major, &minor) != 2 || makedev(major, minor) != st.st_dev)
      continue;
    map_ = reinterpret_cast<void*>(start);
    map_len_ = end - start;
    return;
  }
}

void Env::trimMapping() {
  if (!map_) return;
  // The map is read-only (no MDB_WRITEMAP) and shared: its pages are clean copies of the page
  // cache, so dropping them loses nothing; the next access faults them back in.
  (void)madvise(map_, map_len_, MADV_DONTNEED);
}

WriteTxn::WriteTxn(Env& env) : env_(env) {
  check(mdb_txn_begin(env_.get(), nullptr, 0, &txn_), env_.dir(), "beginning a write transaction");
}

WriteTxn::~WriteTxn() {
  if (txn_) mdb_txn_abort(txn_);
}

MDB_dbi WriteTxn::open(const char* name, unsigned flags) {
  MDB_dbi dbi = 0;
  if (const int rc = mdb_dbi_open(txn_, name, flags, &dbi))
    fail(rc, env_.dir(), std::string("opening database '") + name + "'");
  return dbi;
}

bool WriteTxn::get(MDB_dbi dbi, MDB_val key, MDB_val& out) {
  const int rc = mdb_get(txn_, dbi, &key, &out);
  if (rc == MDB_NOTFOUND) return false;
  check(rc, env_.dir(), "reading");
  return true;
}

void WriteTxn::put(MDB_dbi dbi, MDB_val key, std::span<const uint8_t> value) {
  MDB_val v = val(value);
  if (const int rc = mdb_put(txn_, dbi, &key, &v, 0))
    fail(rc, env_.dir(), "writing " + std::to_string(value.size()) + " bytes");
}

uint8_t* WriteTxn::reserve(MDB_dbi dbi, MDB_val key, size_t size) {
  MDB_val v{size, nullptr};
  if (const int rc = mdb_put(txn_, dbi, &key, &v, MDB_RESERVE))
    fail(rc, env_.dir(), "writing " + std::to_string(size) + " bytes");
  return static_cast<uint8_t*>(v.mv_data);
}

bool WriteTxn::del(MDB_dbi dbi, MDB_val key) {
  const int rc = mdb_del(txn_, dbi, &key, nullptr);
  if (rc == MDB_NOTFOUND) return false;
  check(rc, env_.dir(), "deleting");
  return true;
}

void WriteTxn::drop(MDB_dbi dbi) {
  check(mdb_drop(txn_, dbi, 0), env_.dir(), "emptying a database");
}

void WriteTxn::commit() {
  MDB_txn* t = txn_;
  txn_ = nullptr;  // mdb_txn_commit frees the transaction even when it fails
  check(mdb_txn_commit(t), env_.dir(), "committing");
}

Reader::~Reader() {
  if (txn_) mdb_txn_abort(txn_);
}

void Reader::begin() {
  if (!txn_) {
    check(mdb_txn_begin(env_.get(), nullptr, MDB_RDONLY, &txn_), env_.dir(),
          "beginning a read transaction");
  } else {
    check(mdb_txn_renew(txn_), env_.dir(), "renewing a read transaction");
  }
  active_ = true;
}

void Reader::end() {
  if (active_) mdb_txn_reset(txn_);
  active_ = false;
}

bool Reader::get(MDB_dbi dbi, MDB_val key, MDB_val& out) {
  const int rc = mdb_get(txn_, dbi, &key, &out);
  if (rc == MDB_NOTFOUND) return false;
  check(rc, env_.dir(), "reading");
  return true;
}

}  // namespace starling::simulator::lmdb
