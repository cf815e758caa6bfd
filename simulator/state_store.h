#pragma once
// ClientStateStore: every simulated client's state (error-feedback residuals, SCAFFOLD control
// variates, low-rank factors, PowerSGD's pending phase: whatever components its ClientState holds)
// kept off the device, in host memory up to a bound and spilled beyond it to LMDB (one
// memory-mapped file in one folder, not one file per client). Memory does not grow with the number
// of clients: it stays at `memory_bytes` plus a constant (one blob of scratch, LMDB's fixed
// buffers, a 4 MiB flush batch); the spilled states cost disk, and LMDB's read-only map is dropped
// from the process's resident set every 4 MiB read or written through it. docs/architecture.md
// says why LMDB.
//
// Contracts:
// - A state is stored in its serialized form (ClientState::saveTo), so what load() returns is
//   byte-identical to what store() was given (saveTo of both gives the same bytes).
// - A client's blob lives in exactly one place: the memory LRU or the LMDB file. An empty state
//   (no components) is stored as nothing: storing one erases the client.
// - store() puts the blob at the front of the LRU; when the accounted memory (blob bytes plus
//   kEntryOverhead per client) would pass memory_bytes, the least recently used blobs move to
//   LMDB in one transaction. load() of a client in memory makes it the most recently used; load()
//   of a spilled client reads it from LMDB and leaves it there (the caller stores the updated state
//   next, which brings it to memory; promoting the stale blob would cost a write for nothing).
//   A blob larger than memory_bytes goes straight to LMDB.
// - store() gives the strong guarantee: if it throws (IoError from LMDB, bad_alloc), the store
//   holds what it held before.
// - Persistence: a store on a caller's spill_dir survives its process. flush() writes every blob
//   to LMDB and fsyncs (mdb_env_sync): that is the checkpoint. Reopening the folder with
//   resume = true shows exactly the states as of the last flush() (no state at all if never
//   flushed), whatever happened after it: stores after the flush, evictions, a kill -9 at any
//   point, or a destructor that did not flush. (Between flushes, the first change to a client's
//   disk entry keeps its checkpoint version in an undo table; reopening puts those back; flush()
//   empties it.) What flush() does not cover: an OS crash or power loss after further stores, since
//   commits between flushes are not fsynced (LMDB's MDB_NOSYNC): the file may then be unusable, and
//   reopening throws IoError. A store on a fresh temporary folder (spill_dir empty) removes the
//   folder when it goes.
// - Errors: IoError naming the folder and LMDB's message for any LMDB failure (map full, disk full,
//   permissions); IoError naming the client for a stored blob that does not parse or belongs to
//   another model; ConfigError for bad options, a folder in use by another store (in this or
//   another process: an exclusive flock), a folder that already holds a store without resume, or a
//   resumed store of another model; InvalidArgument for storing a state bound to another model.
//
// Threading: not thread-safe. One store per worker process, used by one thread at a time (it may
// move between threads). Two stores in one process are independent (no globals) as long as their
// folders differ. A moved-from store may only be destroyed or assigned to.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "core/client_state.h"

namespace starling::simulator {

struct StateStoreOptions {
  // The bound on blobs kept in memory, per-client bookkeeping included (kEntryOverhead each).
  // 0 keeps nothing in memory (every store writes to LMDB).
  uint64_t memory_bytes = 256ull << 20;
  // The folder holding the LMDB file. Empty: a fresh temporary folder, removed with the store.
  std::string spill_dir;
  // LMDB's map size: the largest the spill file may grow. Address space only (the file is sparse
  // and grows as written), so the default is generous; MDB_MAP_FULL (an IoError) past it.
  uint64_t map_bytes = 64ull << 30;
  // Reopen the store already in spill_dir (see flush()) instead of creating a new one.
  bool resume = false;

  // Throws ConfigError naming the bad value: map_bytes out of [1 MiB, 2^46], memory_bytes over
  // 2^46, resume without a spill_dir.
  void validate() const;
};

class ClientStateStore {
 public:
  // What one client costs in memory besides its blob (LRU list node, hash node and bucket, the
  // blob's allocation header), counted against memory_bytes.
  static constexpr uint64_t kEntryOverhead = 128;

  struct Stats {
    uint64_t clients = 0;          // clients with a stored (non-empty) state, in memory or on disk
    uint64_t memory_bytes = 0;     // accounted memory of the LRU (<= the bound, always)
    uint64_t memory_clients = 0;   // clients whose blob is in memory
    uint64_t spilled_clients = 0;  // clients whose blob is in LMDB
    uint64_t spilled_bytes = 0;    // their blobs' bytes
    uint64_t hits = 0;             // load() found the client in memory
    uint64_t misses = 0;           // load() found nothing (an empty state)
    uint64_t spills = 0;           // blobs written to LMDB (evictions, oversized stores, flushes)
    uint64_t loads_from_disk = 0;  // load() read the client from LMDB
  };

  // Whether `dir` holds a store (its LMDB file): what resume = true reopens, and what a store
  // without resume refuses.
  static bool holdsStore(const std::string& dir);

  // Validates the options, creates or reopens the folder and the LMDB file. Every state stored must
  // be bound to `layout_fingerprint`; a resumed folder must have been created with the same one.
  ClientStateStore(StateStoreOptions options, uint64_t layout_fingerprint);
  ~ClientStateStore();
  ClientStateStore(ClientStateStore&&) noexcept;
  ClientStateStore& operator=(ClientStateStore&&) noexcept;
  ClientStateStore(const ClientStateStore&) = delete;
  ClientStateStore& operator=(const ClientStateStore&) = delete;

  // `out` becomes the client's state, or an empty state bound to the fingerprint if none is stored.
  // Parsing reuses the component objects (and their buffers) `out` already holds. On a throw
  // (IoError: corrupt blob, LMDB failure) `out` is left empty and the store is unchanged.
  void load(uint64_t client_id, ClientState& out);
  // Stores a copy of `s` (serialized); an empty `s` erases the client. InvalidArgument if `s` is
  // bound to another fingerprint.
  void store(uint64_t client_id, const ClientState& s);
  // Every blob to LMDB, then fsync: the checkpoint a resumed store sees. Memory is empty after.
  // `generation` is recorded with it, in the transaction that makes it the checkpoint: a caller's
  // checkpoint names the flush its states are at.
  void flush(uint64_t generation = 0);
  // The generation of the last flush (of a resumed store: of the flush it resumed; 0 when none
  // named one).
  uint64_t generation() const;

  Stats stats() const;
  const std::filesystem::path& spillDir() const;
  uint64_t layoutFingerprint() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Where a simulation keeps its client states and whether it reopens them: the rules of
// state.dir beside state.checkpoint, written once for starling-sim's synchronous and buffered
// runs (docs/simulation.md).
struct ClientStatesSite {
  std::string dir;         // state.dir; empty: CHECKPOINT.states with a checkpoint, else none
  std::string checkpoint;  // state.checkpoint; empty: none
  int rank = 0;            // this worker's
  bool buffered = false;   // round.mode = async or semisync
  bool lead = true;        // the first worker (a buffered run keeps every state in its store)
  uint64_t memory_bytes = uint64_t{256} << 20;
};

struct ClientStatesPlan {
  StateStoreOptions options;  // spill_dir empty: a temporary folder
  std::string folder;         // the run's state folder (dir/worker-R is this worker's); empty: none
};

// The store's options for `site`:
// - a buffered run reopens whatever store is there when it has a checkpoint: the checkpoint names
//   the step its states are at (the asynchronous simulation refuses a pair that does not match,
//   and a store killed before its first checkpoint reopens empty);
// - a synchronous run reopens the states its workers flushed at the checkpoint; one without its
//   checkpoint reopens the folder too (so a run still using it is refused by its lock) and is
//   checked by checkClientStates.
ClientStatesPlan planClientStates(const ClientStatesSite& site);

// A synchronous run's states that no checkpoint resumes, said in the settings' words: a store
// never flushed (killed before its first checkpoint) reopens empty and the run starts over;
// flushed states whose checkpoint is gone, or an earlier run's without one, are a ConfigError
// naming what to restore or remove.
void checkClientStates(const ClientStatesSite& site, const ClientStatesPlan& plan,
                       const ClientStateStore& store);

}  // namespace starling::simulator
