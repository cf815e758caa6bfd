#include "simulator/state_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <list>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "simulator/lmdb_env.h"

namespace starling::simulator {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxBytes = 1ull << 46;
constexpr uint32_t kMetaFormat = 1;
constexpr uint64_t kGenerationKey = 2;  // meta: the generation of the last flush (0 if none)
// After about this many bytes read or written through LMDB, its map is dropped from the process's
// resident set (lmdb::Env::trimMapping). Reads fault pages of the map in, and so do writes (the
// B-tree pages they copy, and the kernel's fault-around mapping neighbouring cached pages): without
// the trim, 100,000 spilled states of 40 KB left 3.9 GB of the file resident. Smaller intervals
// cost more refaults of the B-tree pages (bench/state_store_bench.cc).
constexpr uint64_t kTrimBytes = 4ull << 20;
// flush() writes in transactions of about this many bytes: LMDB keeps a transaction's dirty pages
// in (malloc'd) memory until commit, and the blobs leave the LRU only after it, so a batch is what
// a flush costs above the bound. (With one 64 MB batch, the heap kept 64 MB more after a flush.)
constexpr uint64_t kFlushBatchBytes = 4ull << 20;
constexpr uint8_t kUndoAbsent = 0;
constexpr uint8_t kUndoBlob = 1;

// An exclusive flock on <dir>/lock, held for the store's life. flock (unlike the fcntl locks
// LMDB itself would use) conflicts between two opens in one process too, so a second store on the
// same folder is refused whether it lives in this process or another. LMDB must never have one
// file open twice in a process.
class FolderLock {
 public:
  explicit FolderLock(const fs::path& dir) {
    const fs::path p = dir / "lock";
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0)
      STARLING_THROW(IoError, "client-state store ", dir.string(), ": cannot open ", p.string(),
                     ": ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd_);
      if (err == EWOULDBLOCK)
        STARLING_THROW(
            ConfigError, "client-state store ", dir.string(),
            ": the folder is in use by another client-state store (in this or another process)");
      STARLING_THROW(IoError, "client-state store ", dir.string(), ": cannot lock ", p.string(),
                     ": ", std::strerror(err));
    }
  }
  ~FolderLock() { ::close(fd_); }
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

fs::path makeTempDir() {
  std::string templ = (fs::temp_directory_path() / "starling-state-XXXXXX").string();
  if (::mkdtemp(templ.data()) == nullptr)
    STARLING_THROW(IoError, "client-state store: cannot create a temporary folder ", templ, ": ",
                   std::strerror(errno));
  return templ;
}

std::vector<uint8_t> u64Bytes(uint64_t v) {
  std::vector<uint8_t> b;
  ByteWriter(b).u64(v);
  return b;
}

}  // namespace

void StateStoreOptions::validate() const {
  if (map_bytes < (1ull << 20) || map_bytes > kMaxBytes)
    STARLING_THROW(ConfigError, "state store: map_bytes = ", map_bytes,
                   " must be in [1 MiB, 2^46] (", (1ull << 20), " to ", kMaxBytes, ")");
  if (memory_bytes > kMaxBytes)
    STARLING_THROW(ConfigError, "state store: memory_bytes = ", memory_bytes,
                   " must be at most 2^46 (", kMaxBytes, ")");
  if (resume && spill_dir.empty())
    STARLING_THROW(
        ConfigError,
        "state store: resume = true needs spill_dir (the folder of the store to reopen)");
}

class ClientStateStore::Impl {
 public:
  Impl(StateStoreOptions options, uint64_t fingerprint)
      : opt_(std::move(options)), fp_(fingerprint) {
    opt_.validate();
    if (opt_.spill_dir.empty()) {
      dir_ = makeTempDir();
      owns_dir_ = true;
    } else {
      dir_ = opt_.spill_dir;
      track_undo_ = true;  // only a kept folder can be resumed
    }
    try {
      open();
    } catch (...) {
      close();
      throw;
    }
  }
  ~Impl() { close(); }

  void load(uint64_t id, ClientState& out) {
    if (auto it = index_.find(id); it != index_.end()) {
      parse(id, it->second->blob, out);
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return;
    }
    {
      reader_->begin();
      struct End {
        lmdb::Reader& r;
        ~End() { r.end(); }
      } end{*reader_};
      MDB_val v;
      lmdb::Key k(id);
      if (!reader_->get(states_, k.val(), v)) {
        out.reset(fp_);
        ++misses_;
        return;
      }
      touched_ += v.mv_size;
      parse(id, lmdb::span(v), out);  // straight from the map, no copy
      ++loads_from_disk_;
    }
    maybeTrim();
  }

  void store(uint64_t id, const ClientState& s) {
    STARLING_CHECK_ARG(s.layoutFingerprint() == fp_, "client-state store: client ", id,
                       "'s state is bound to model ", s.layoutFingerprint(), ", the store to ",
                       fp_);
    if (s.size() == 0) {
      erase(id);
      return;
    }
    s.saveTo(scratch_);
    const uint64_t size = scratch_.size();
    auto it = index_.find(id);
    const bool resident = it != index_.end();
    const std::span<const uint8_t> bytes(scratch_);

    if (size + kEntryOverhead > opt_.memory_bytes) {  // never fits: straight to LMDB
      Delta d;
      lmdb::WriteTxn t(*env_);
      diskSet(t, id, &bytes, d);
      t.commit();
      apply(d);
      if (resident) dropResident(it->second);
      maybeTrim();
      return;
    }

    // The new blob's buffer: the resident one when its capacity fits (no allocation, and the
    // accounted cost stays honest), else a fresh exact-size one, allocated before anything changes.
    bool reuse = false;
    std::vector<uint8_t> blob;
    uint64_t new_cost = 0;
    if (resident && it->second->blob.capacity() >= size &&
        it->second->blob.capacity() <= size + size / 4) {
      reuse = true;
      new_cost = it->second->blob.capacity() + kEntryOverhead;
    } else {
      blob.assign(scratch_.begin(), scratch_.end());
      new_cost = blob.capacity() + kEntryOverhead;
    }

    // Victims: least recently used first, until the new total fits.
    uint64_t used = used_ - (resident ? it->second->cost() : 0) + new_cost;
    std::vector<List::iterator> victims;
    for (auto v = lru_.end(); used > opt_.memory_bytes && v != lru_.begin();) {
      --v;
      if (v->id == id) continue;
      used -= v->cost();
      victims.push_back(v);
    }

    // A new entry is inserted first (the only allocations) and taken back if LMDB fails.
    List fresh;
    if (!resident) {
      fresh.push_back(Entry{id, std::move(blob)});
      index_.emplace(id, fresh.begin());
    }
    try {
      // A non-resident client may have a (now stale) blob in LMDB: it goes, so that the blob lives
      // in one place only.
      if (!victims.empty() || !resident) {
        Delta d;
        lmdb::WriteTxn t(*env_);
        for (auto v : victims) {
          const std::span<const uint8_t> vb(v->blob);
          diskSet(t, v->id, &vb, d);
        }
        if (!resident) diskSet(t, id, nullptr, d);
        if (d.changed) t.commit();
        apply(d);
      }
    } catch (...) {
      if (!resident) index_.erase(id);
      throw;
    }

    // Committed: nothing below throws.
    for (auto v : victims) dropResident(v);
    if (resident) {
      Entry& e = *it->second;
      used_ -= e.cost();
      if (reuse)
        e.blob.assign(scratch_.begin(), scratch_.end());  // within capacity: no allocation
      else
        e.blob = std::move(blob);
      used_ += e.cost();
      lru_.splice(lru_.begin(), lru_, it->second);
    } else {
      used_ += fresh.front().cost();
      lru_.splice(lru_.begin(), fresh);
    }
    maybeTrim();
  }

  void flush(uint64_t generation) {
    while (!lru_.empty()) {
      // Oldest first, in transactions of about kFlushBatchBytes. Each committed batch leaves
      // memory; a failure leaves every blob in exactly one place.
      Delta d;
      lmdb::WriteTxn t(*env_);
      std::vector<List::iterator> batch;
      uint64_t bytes = 0;
      for (auto v = lru_.end(); v != lru_.begin() && bytes < kFlushBatchBytes;) {
        --v;
        const std::span<const uint8_t> vb(v->blob);
        diskSet(t, v->id, &vb, d);
        bytes += vb.size();
        batch.push_back(v);
      }
      t.commit();
      apply(d);
      for (auto v : batch) dropResident(v);
    }
    if (track_undo_) {
      // The checkpoint is now what LMDB holds: the undo records of the previous one go, and its
      // generation is recorded in the same transaction.
      lmdb::WriteTxn t(*env_);
      t.drop(undo_);
      t.put(meta_, lmdb::Key(kGenerationKey).val(), u64Bytes(generation));
      t.commit();
    }
    generation_ = generation;
    env_->sync();
    env_->trimMapping();
    touched_ = 0;
  }

  uint64_t generation() const { return generation_; }

  Stats stats() const {
    Stats s;
    s.memory_clients = index_.size();
    s.clients = s.memory_clients + spilled_clients_;
    s.memory_bytes = used_;
    s.spilled_clients = spilled_clients_;
    s.spilled_bytes = spilled_bytes_;
    s.hits = hits_;
    s.misses = misses_;
    s.spills = spills_;
    s.loads_from_disk = loads_from_disk_;
    return s;
  }

  const fs::path& dir() const { return dir_; }
  uint64_t fingerprint() const { return fp_; }

 private:
  struct Entry {
    uint64_t id;
    std::vector<uint8_t> blob;
    uint64_t cost() const { return blob.capacity() + kEntryOverhead; }
  };
  using List = std::list<Entry>;  // front: most recently used
  // Changes to the spill counters, applied once their transaction committed.
  struct Delta {
    int64_t clients = 0;
    int64_t bytes = 0;
    uint64_t spills = 0;
    bool changed = false;
  };

  void open() {
    if (!owns_dir_) {
      std::error_code ec;
      fs::create_directories(dir_, ec);
      if (ec)
        STARLING_THROW(IoError, "client-state store: cannot create the folder ", dir_.string(),
                       ": ", ec.message());
      if (!fs::is_directory(dir_))
        STARLING_THROW(ConfigError, "state store: spill_dir ", dir_.string(), " is not a folder");
    }
    lock_ = std::make_unique<FolderLock>(dir_);
    const bool exists = ClientStateStore::holdsStore(dir_.string());
    if (exists && !opt_.resume)
      STARLING_THROW(ConfigError, "state store: spill_dir ", dir_.string(),
                     " already holds a client-state store: set resume = true to continue it, or "
                     "choose another folder");
    if (!exists && opt_.resume)
      STARLING_THROW(ConfigError, "state store: resume = true, but spill_dir ", dir_.string(),
                     " holds no client-state store (no data.mdb)");
    env_ = std::make_unique<lmdb::Env>(dir_, opt_.map_bytes, 3);
    lmdb::WriteTxn t(*env_);
    meta_ = t.open("meta", MDB_CREATE);
    states_ = t.open("states", MDB_CREATE);
    undo_ = t.open("undo", MDB_CREATE);
    lmdb::Key format_key(0), fp_key(1);
    if (!opt_.resume) {
      std::vector<uint8_t> f;
      ByteWriter(f).u32(kMetaFormat);
      t.put(meta_, format_key.val(), f);
      t.put(meta_, fp_key.val(), u64Bytes(fp_));
    } else {
      MDB_val v;
      uint32_t format = 0;
      uint64_t stored_fp = 0;
      try {
        if (!t.get(meta_, format_key.val(), v)) STARLING_THROW(IoError, "no format record");
        ByteReader fr(lmdb::span(v), "format record");
        format = fr.u32();
        if (!t.get(meta_, fp_key.val(), v)) STARLING_THROW(IoError, "no fingerprint record");
        ByteReader pr(lmdb::span(v), "fingerprint record");
        stored_fp = pr.u64();
      } catch (const IoError& e) {
        STARLING_THROW(IoError, "client-state store ", dir_.string(),
                       ": not a readable store: ", e.what());
      }
      if (format != kMetaFormat)
        STARLING_THROW(IoError, "client-state store ", dir_.string(), ": format ", format,
                       " (this build reads ", kMetaFormat, ")");
      if (stored_fp != fp_)
        STARLING_THROW(ConfigError, "state store: spill_dir ", dir_.string(),
                       " holds states of model fingerprint ", stored_fp, ", this run's model has ",
                       fp_);
      rollBackToCheckpoint(t);
      countSpilled(t);
      if (t.get(meta_, lmdb::Key(kGenerationKey).val(), v)) {
        ByteReader gr(lmdb::span(v), "client-state store " + dir_.string() + ": generation record");
        generation_ = gr.u64();
      }
    }
    t.commit();
    env_->sync();
    reader_ = std::make_unique<lmdb::Reader>(*env_);
  }

  // Puts back every client's version of the last flush() (the undo records), drops the records.
  void rollBackToCheckpoint(lmdb::WriteTxn& t) {
    MDB_cursor* c = nullptr;
    lmdb::check(mdb_cursor_open(t.get(), undo_, &c), dir_, "opening a cursor");
    std::vector<std::pair<uint64_t, std::vector<uint8_t>>> records;
    MDB_val k, v;
    int rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
    for (; rc == MDB_SUCCESS; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
      auto b = lmdb::span(v);
      records.emplace_back(lmdb::Key::decode(k), std::vector<uint8_t>(b.begin(), b.end()));
    }
    mdb_cursor_close(c);
    if (rc != MDB_NOTFOUND) lmdb::fail(rc, dir_, "reading the undo records");
    for (auto& [id, rec] : records) {
      if (rec.empty() || rec[0] > kUndoBlob)
        STARLING_THROW(IoError, "client-state store ", dir_.string(),
                       ": corrupt undo record for client ", id);
      lmdb::Key key(id);
      if (rec[0] == kUndoAbsent)
        t.del(states_, key.val());
      else
        t.put(states_, key.val(), std::span<const uint8_t>(rec).subspan(1));
    }
    t.drop(undo_);
  }

  void countSpilled(lmdb::WriteTxn& t) {
    MDB_cursor* c = nullptr;
    lmdb::check(mdb_cursor_open(t.get(), states_, &c), dir_, "opening a cursor");
    MDB_val k, v;
    int rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
    // Only the leaf nodes are read: a value's size is in its node, its pages are not touched.
    for (; rc == MDB_SUCCESS; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
      ++spilled_clients_;
      spilled_bytes_ += v.mv_size;
    }
    mdb_cursor_close(c);
    if (rc != MDB_NOTFOUND) lmdb::fail(rc, dir_, "counting the stored states");
  }

  void close() noexcept {
    reader_.reset();
    env_.reset();
    lock_.reset();
    if (owns_dir_ && !dir_.empty()) {
      std::error_code ec;
      fs::remove_all(dir_, ec);  // best effort: a destructor does not throw
    }
  }

  void parse(uint64_t id, std::span<const uint8_t> bytes, ClientState& out) {
    try {
      out.loadFrom(bytes);
    } catch (const Error& e) {
      STARLING_THROW(IoError, "client-state store ", dir_.string(), ": client ", id,
                     ": stored state is corrupt: ", e.what());
    }
    if (out.layoutFingerprint() != fp_) {
      const uint64_t got = out.layoutFingerprint();
      out.reset(0);
      STARLING_THROW(IoError, "client-state store ", dir_.string(), ": client ", id,
                     ": stored state belongs to model ", got, ", not ", fp_);
    }
  }

  // Sets client `id`'s LMDB entry to `value` (nullptr: deletes it). In a resumable store, the first
  // change since the last flush() first records the entry's checkpoint version (or its absence).
  void diskSet(lmdb::WriteTxn& t, uint64_t id, const std::span<const uint8_t>* value, Delta& d) {
    lmdb::Key k(id);
    MDB_val old;
    const bool had = t.get(states_, k.val(), old);
    if (!had && !value) return;
    if (track_undo_) {
      MDB_val u;
      if (!t.get(undo_, k.val(), u)) {
        if (had) {
          uint8_t* p = t.reserve(undo_, k.val(), old.mv_size + 1);
          p[0] = kUndoBlob;
          // `old` may have moved if the reserve touched its page: read it again.
          if (!t.get(states_, k.val(), old))
            STARLING_THROW(InternalError, "client-state store: entry vanished");
          std::memcpy(p + 1, old.mv_data, old.mv_size);
          touched_ += old.mv_size;
        } else {
          t.put(undo_, k.val(), std::span<const uint8_t>(&kUndoAbsent, 1));
        }
      }
    }
    if (had) {
      d.clients -= 1;
      d.bytes -= static_cast<int64_t>(old.mv_size);
    }
    if (value) {
      t.put(states_, k.val(), *value);
      touched_ += value->size();  // see kTrimBytes
      d.clients += 1;
      d.bytes += static_cast<int64_t>(value->size());
      ++d.spills;
    } else {
      t.del(states_, k.val());
      touched_ += 4096;  // freeing a value reads its first page
    }
    d.changed = true;
  }

  void apply(const Delta& d) {
    spilled_clients_ = static_cast<uint64_t>(static_cast<int64_t>(spilled_clients_) + d.clients);
    spilled_bytes_ = static_cast<uint64_t>(static_cast<int64_t>(spilled_bytes_) + d.bytes);
    spills_ += d.spills;
  }

  void erase(uint64_t id) {
    if (auto it = index_.find(id); it != index_.end()) {
      dropResident(it->second);
      return;
    }
    Delta d;
    lmdb::WriteTxn t(*env_);
    diskSet(t, id, nullptr, d);
    if (d.changed) t.commit();
    apply(d);
    maybeTrim();
  }

  void dropResident(List::iterator v) noexcept {
    used_ -= v->cost();
    index_.erase(v->id);
    lru_.erase(v);
  }

  void maybeTrim() {
    if (touched_ < kTrimBytes) return;
    env_->trimMapping();
    touched_ = 0;
  }

  StateStoreOptions opt_;
  uint64_t fp_;
  fs::path dir_;
  bool owns_dir_ = false;
  bool track_undo_ = false;
  std::unique_ptr<FolderLock> lock_;
  std::unique_ptr<lmdb::Env> env_;
  std::unique_ptr<lmdb::Reader> reader_;
  MDB_dbi meta_ = 0, states_ = 0, undo_ = 0;

  List lru_;
  std::unordered_map<uint64_t, List::iterator> index_;
  uint64_t used_ = 0;
  std::vector<uint8_t> scratch_;
  uint64_t touched_ = 0;

  uint64_t spilled_clients_ = 0, spilled_bytes_ = 0;
  uint64_t generation_ = 0;  // of the last flush (a resumed store's: of the flush it resumed)
  uint64_t hits_ = 0, misses_ = 0, spills_ = 0, loads_from_disk_ = 0;
};

ClientStateStore::ClientStateStore(StateStoreOptions options, uint64_t layout_fingerprint)
    : impl_(std::make_unique<Impl>(std::move(options), layout_fingerprint)) {}
bool ClientStateStore::holdsStore(const std::string& dir) {
  return fs::exists(fs::path(dir) / "data.mdb");
}

ClientStateStore::~ClientStateStore() = default;
ClientStateStore::ClientStateStore(ClientStateStore&&) noexcept = default;
ClientStateStore& ClientStateStore::operator=(ClientStateStore&&) noexcept = default;

void ClientStateStore::load(uint64_t client_id, ClientState& out) { impl_->load(client_id, out); }
void ClientStateStore::store(uint64_t client_id, const ClientState& s) {
  impl_->store(client_id, s);
}
void ClientStateStore::flush(uint64_t generation) { impl_->flush(generation); }
uint64_t ClientStateStore::generation() const { return impl_->generation(); }
ClientStateStore::Stats ClientStateStore::stats() const { return impl_->stats(); }
const std::filesystem::path& ClientStateStore::spillDir() const { return impl_->dir(); }
uint64_t ClientStateStore::layoutFingerprint() const { return impl_->fingerprint(); }

ClientStatesPlan planClientStates(const ClientStatesSite& site) {
  ClientStatesPlan plan;
  plan.options.memory_bytes = site.memory_bytes;
  // With a checkpoint the client states must survive a crash too (error-feedback residuals,
  // SCAFFOLD's c_i): they are kept beside it unless state.dir says where.
  plan.folder = site.dir;
  if (plan.folder.empty() && !site.checkpoint.empty()) plan.folder = site.checkpoint + ".states";
  // Buffered workers keep every state in the first one's store (simulator/async_sim.h).
  if (site.buffered && !site.lead) plan.folder.clear();
  if (plan.folder.empty()) return plan;
  plan.options.spill_dir = plan.folder + "/worker-" + std::to_string(site.rank);
  const bool stored = ClientStateStore::holdsStore(plan.options.spill_dir);
  if (site.buffered)
    plan.options.resume = !site.checkpoint.empty() && stored;
  else
    plan.options.resume = stored || (!site.checkpoint.empty() && fs::exists(site.checkpoint) &&
                                     fs::exists(plan.options.spill_dir));
  return plan;
}

void checkClientStates(const ClientStatesSite& site, const ClientStatesPlan& plan,
                       const ClientStateStore& store) {
  if (site.buffered || !plan.options.resume || store.stats().clients == 0) return;
  if (!site.checkpoint.empty() && fs::exists(site.checkpoint)) return;
  STARLING_THROW(ConfigError, "the client-state folder ", plan.options.spill_dir, " holds ",
                 store.stats().clients, " clients' states of an earlier run, ",
                 site.checkpoint.empty()
                     ? "and no state.checkpoint resumes them: remove it, or set state.dir to "
                       "another folder"
                     : "and its checkpoint " + site.checkpoint +
                           " is missing: restore the checkpoint, or remove " + plan.folder +
                           " to start over");
}

}  // namespace starling::simulator
