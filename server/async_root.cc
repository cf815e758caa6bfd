#include "server/async_root.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/bytes.h"
#include "core/error.h"
#include "core/file_io.h"
#include "protocol/codec.h"

namespace starling::server {

namespace {
constexpr uint32_t kJournalMagic = 0x4c4e4a41;  // "AJNL"
// 2: refusals are journaled too (kJournalRefused); a journal of format 1 still reads.
constexpr uint32_t kJournalFormat = 2;
constexpr size_t kJournalHeader = 24;  // magic, format, the checkpoint's step and version
constexpr uint8_t kJournalUpdate = 0, kJournalPartial = 1, kJournalRefused = 2;
}  // namespace

// The updates accepted since the last checkpoint, one record each, appended and fsynced before
// the update counts as accepted: length, checksum, then kind, sender, its examples cap and the
// message as it arrived. The server's refusals since then too, as records of the sender alone,
// fsynced as an update's is (a refusal answers a task, as an accepted update does, so they cost
// at most one flush per task; unsynced, a crash of the machine could keep a later record and
// damage an earlier one, which a resume takes for corruption). Its header names the checkpoint it
// follows (step and version); a step writes the checkpoint and starts a new journal, atomically.
struct AsyncRoot::Journal {
  std::string path;
  int fd = -1;
  std::vector<uint8_t> record;  // reused: no allocation per update once warm
  ~Journal() { close(); }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  void openForAppend() {
    fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0)
      STARLING_THROW(IoError, "cannot open the journal ", path, ": ", std::strerror(errno));
  }
  void start(uint64_t step, uint64_t version) {
    close();
    std::vector<uint8_t> h;
    ByteWriter w(h);
    w.u32(kJournalMagic);
    w.u32(kJournalFormat);
    w.u64(step);
    w.u64(version);
    writeFileAtomic(path, h);
    openForAppend();
  }
  void append(uint8_t kind, uint64_t sender, uint64_t cap, std::span<const uint8_t> message) {
    record.clear();
    ByteWriter w(record);
    w.u64(17 + message.size());  // the payload: kind, sender, cap, message
    w.u64(0);                    // its checksum, patched below
    w.u8(kind);
    w.u64(sender);
    w.u64(cap);
    w.bytes(message.data(), message.size());
    w.patchU64(8, fnv1a(std::span<const uint8_t>(record).subspan(16)));
    size_t done = 0;
    while (done < record.size()) {
      const ssize_t n = ::write(fd, record.data() + done, record.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        STARLING_THROW(IoError, "cannot append to the journal ", path, ": ", std::strerror(errno));
      done += static_cast<size_t>(n);
    }
    if (::fdatasync(fd) != 0)
      STARLING_THROW(IoError, "cannot fsync the journal ", path, ": ", std::strerror(errno));
  }
};

void AsyncRootConfig::validate() const {
  if (steps == 0 || steps > 10'000'000)
    STARLING_THROW(ConfigError, "train.rounds (server steps) must be in [1, 10^7], got ", steps);
  if (fleet.concurrency == 0) STARLING_THROW(ConfigError, "async.concurrency must be at least 1");
  if (fleet.min_available == 0)
    STARLING_THROW(ConfigError, "sampling.min_available must be at least 1");
  if (fleet.task_deadline_ms < 10)
    STARLING_THROW(ConfigError, "round.deadline_ms must be at least 10, got ",
                   fleet.task_deadline_ms);
  if (round_ms != 0 && round_ms < 10)
    STARLING_THROW(ConfigError,
                   "round.deadline_ms (a semi-synchronous round) must be at least 10, "
                   "got ",
                   round_ms);
  if (fit.epochs == 0 || fit.epochs > 1000)
    STARLING_THROW(ConfigError, "fit.epochs must be in [1, 1000], got ", fit.epochs);
  if (fit.batch_size == 0) STARLING_THROW(ConfigError, "fit.batch_size must be positive");
  if (!(fit.lr > 0.0f && fit.lr <= 100.0f))
    STARLING_THROW(ConfigError, "fit.lr must be in (0, 100], got ", fit.lr);
}

AsyncRoot::AsyncRoot(std::shared_ptr<const ParamLayout> layout, AsyncServerConfig server,
                     AsyncRootConfig config, std::vector<float> initial)
    : config_((config.validate(), std::move(config))),
      server_(std::move(layout), std::move(server), std::move(initial)) {
  if (config_.round_ms == 0 && !config_.aggregators &&
      config_.fleet.min_available < server_.config().async.buffer_size)
    STARLING_THROW(ConfigError, "async.buffer_size = ", server_.config().async.buffer_size,
                   " needs at least as many clients (each sends one update per model version): "
                   "set sampling.min_available to at least that, got ",
                   config_.fleet.min_available);
  if (!config_.checkpoint.empty()) {
    journal_ = std::make_unique<Journal>();
    journal_->path = config_.checkpoint + ".journal";
    if (std::filesystem::exists(config_.checkpoint)) {
      server_.loadCheckpoint(config_.checkpoint);
      resumed_ = true;
    } else {
      if (std::filesystem::exists(journal_->path))
        STARLING_THROW(IoError, "the journal ", journal_->path, " has no checkpoint ",
                       config_.checkpoint,
                       " beside it: restore the checkpoint, or move the journal away too to "
                       "start fresh");
      server_.saveCheckpoint(config_.checkpoint);  // the journal always follows a checkpoint
    }
    replayJournal();
  }
}

AsyncRoot::~AsyncRoot() = default;

// The journal of the checkpoint just loaded: every whole record added again, in order; a last
// record the kill cut short is dropped (and cut off the file); a journal of the step before (the
// kill came between a step's checkpoint and its new journal) holds updates the step took, and is
// started over. Anything else is an IoError, the files left as they are: a journal of another
// step, a record damaged before the last, a record that does not add again.
void AsyncRoot::replayJournal() {
  Journal& j = *journal_;
  if (!std::filesystem::exists(j.path)) {
    j.start(server_.steps(), server_.version());
    return;
  }
  const std::vector<uint8_t> bytes = readFile(j.path, uint64_t{64} << 30);
  ByteReader r(bytes, "journal " + j.path);
  if (bytes.size() < kJournalHeader || r.u32() != kJournalMagic)
    r.fail("not a journal of asynchronous rounds");
  if (const uint32_t f = r.u32(); f != kJournalFormat && f != 1)
    r.fail("format version ", f, " is not 1 or ", kJournalFormat);
  const uint64_t step = r.u64(), version = r.u64();
  if (step + 1 == server_.steps()) {
    j.start(server_.steps(), server_.version());
    return;
  }
  if (step != server_.steps() || version != server_.version())
    r.fail("it follows step ", step, " (model version ", version, "), the checkpoint is of step ",
           server_.steps(), " (version ", server_.version(),
           "): they are not of one run; restore the pair");
  protocol::DecodeLimits limits;  // a FlatBuffers message is under 2 GiB
  limits.max_bytes =
      std::min<size_t>(std::max<size_t>(limits.max_bytes, bytes.size()), (size_t{1} << 31) - 1);
  protocol::Decoder decoder(server_.scheme().layout(), limits);
  size_t good = r.position();
  uint64_t records = 0;
  while (r.remaining() > 0) {
    ++records;
    // A record the kill cut short is the last one: its header or payload runs past the end, or
    // its checksum fails on the file's last bytes. Damage before that is not a kill's.
    if (r.remaining() < 16) break;
    const uint64_t len = r.u64(), sum = r.u64();
    if (len > r.remaining()) break;
    const bool last = len == r.remaining();
    const std::span<const uint8_t> payload = r.view(len);
    if (len < 17 || fnv1a(payload) != sum) {
      if (last) break;
      r.fail("record ", records, " is damaged and more follow: not a crash's cut");
    }
    ByteReader p(payload, "journal " + j.path + " record " + std::to_string(records));
    const uint8_t kind = p.u8();
    const uint64_t sender = p.u64(), cap = p.u64();
    const std::span<const uint8_t> message = p.view(p.remaining());
    try {
      if (kind == kJournalUpdate)
        server_.add(decoder.decodeUpdate(message), aggregation::ClientLimits{cap});
      else if (kind == kJournalPartial)
        server_.addPartial(decoder.decodePartial(message), sender);
      else if (kind == kJournalRefused && message.empty())
        server_.countRefusal();
      else if (kind == kJournalRefused)
        p.fail("a refusal record carries ", message.size(), " bytes of message, not none");
      else
        p.fail("kind ", int{kind});
    } catch (const InputError& e) {
      p.fail("it does not add again to the checkpoint's buffer: ", e.what());
    } catch (const InvalidArgument& e) {
      p.fail("it does not add again to the checkpoint's buffer: ", e.what());
    }
    if (kind == kJournalRefused)
      ++refusals_replayed_;
    else
      ++replayed_;
    good = r.position();
  }
  torn_bytes_ = bytes.size() - good;
  if (torn_bytes_ > 0) std::filesystem::resize_file(j.path, good);
  j.openForAppend();
  if (replayed_ > 0) resumed_ = true;
}

// The whole server, then a new journal that follows it.
void AsyncRoot::checkpoint() {
  if (config_.checkpoint.empty()) return;
  server_.saveCheckpoint(config_.checkpoint);
  journal_->start(server_.steps(), server_.version());
}

void AsyncRoot::taken(const AsyncArrival& a) {
  if (journal_)
    journal_->append(a.partial ? kJournalPartial : kJournalUpdate, a.client,
                     a.partial ? 0 : a.limits.max_examples, a.message);
}

void AsyncRoot::refused(const AsyncArrival& a) {
  if (journal_) journal_->append(kJournalRefused, a.client, 0, {});
}

void AsyncRoot::stepped(const RoundRecord& /*rec*/) { checkpoint(); }

void AsyncRoot::run(AsyncFleet& clients, const std::function<void(const RoundRecord&)>& progress,
                    const std::function<void()>& accepted) {
  if (done()) return;
  AsyncEngineConfig ec;
  ec.steps = config_.steps;
  ec.concurrency = config_.fleet.concurrency;
  ec.round_seconds = config_.round_ms / 1000.0;
  ec.wait_for_first_task = true;  // a root waiting for clients takes no empty steps
  ec.fit = config_.fit;
  ec.task_deadline_ms = config_.fleet.task_deadline_ms;
  ec.eval_every = config_.eval_every;
  ec.eval_applied_only = true;
  ec.evaluate = config_.evaluate;
  ec.metrics = config_.metrics;
  AsyncEngine engine(server_, std::move(ec), this);
  engine.run(clients, progress, accepted);
}

void AsyncRoot::run(ZmqFleet& fleet, const std::function<void(const RoundRecord&)>& progress,
                    const std::function<void()>& accepted) {
  if (!done()) run(*fleet.asyncFleet(config_.fleet), progress, accepted);
  fleet.finish("all " + std::to_string(config_.steps) + " steps done");
}

}  // namespace starling::server
