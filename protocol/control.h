#pragma once
// The deployment's control messages (docs/protocol.md): Register, Welcome, Heartbeat, Task,
// Evaluation, Reject, Shutdown and Chunk, next to the Update and PartialAggregate of codec.h.
//
// peekKind() tells what a message is without verifying it (a few bounds-checked reads), so a
// receiver can route it; every decode*() then verifies the whole buffer (size prefix, identifier,
// FlatBuffers Verifier with a table budget, schema version, body type) and checks its fields, and
// throws InputError with its own code on any failure, never returning a partial result. Decoded
// control messages are small owned structs; decodeTask copies the model (a client decodes one
// task per phase).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "compression/payload.h"
#include "core/input_error.h"
#include "core/param_layout.h"

namespace starling::protocol {

// Matches the Body union of starling.fbs.
enum class MessageKind : uint8_t {
  kUpdate = 1,
  kPartial = 2,
  kRegister = 3,
  kWelcome = 4,
  kHeartbeat = 5,
  kTask = 6,
  kEvaluation = 7,
  kReject = 8,
  kShutdown = 9,
  kChunk = 10,
  kSplitHello = 11,
  kSplitStep = 12,
  kSplitReply = 13,
  kSplitBottom = 14,
  kSplitAverage = 15,
  kSecAggSetup = 16,  // secure aggregation (protocol/secagg_wire.h)
  kSecAggKeys = 17,
  kSecAggAdverts = 18,
  kSecAggShares = 19,
  kSecAggMasked = 20,
  kSecAggUnmask = 21,
  kSecAggReveal = 22,
  kSecAggRelay = 23,
  kSecAggSurvivors = 24,
  kSecAggSigned = 25,
};
const char* kindName(MessageKind k);

// The body type of a size-prefixed Starling message, or nullopt when the bytes are too short,
// do not carry the identifier, or the root table's type field lies outside the buffer. Not a
// verification: decode the message before reading anything else.
std::optional<MessageKind> peekKind(std::span<const uint8_t> bytes);

enum class Role : uint8_t { kClient = 0, kAggregator = 1 };

struct RegisterMsg {
  uint64_t client_id = 0;
  Role role = Role::kClient;
  uint64_t layout_fingerprint = 0;
  uint64_t num_examples = 0;
  uint64_t eval_examples = 0;
  uint64_t model_version = 0;
  std::vector<std::string> capabilities;  // at most 16, each 1..32 printable bytes
};

struct WelcomeMsg {
  uint64_t client_id = 0;
  uint64_t session = 0;
  uint32_t heartbeat_ms = 0;
  uint64_t max_message_bytes = 0;
  uint64_t chunk_bytes = 0;
};

// One client behind an edge aggregator, as that aggregator's fleet sees it (the root's status
// page shows it; no round reads it).
struct SubtreePeer {
  uint64_t id = 0;
  bool online = false, in_round = false;
  uint32_t seen_ms = 0;
  uint64_t updates = 0, refused = 0;
  uint32_t last_refusal = 0;  // an Errc (core/input_error.h) plus one; 0: none
  bool operator==(const SubtreePeer&) const = default;
};

// SubtreePeer::last_refusal from an error code and back (0: none; a code this build does not know,
// from a newer aggregator, reads as none).
inline uint32_t refusalField(std::optional<Errc> code) {
  return code ? static_cast<uint32_t>(*code) + 1 : 0;
}
inline std::optional<Errc> refusalOf(uint32_t field) {
  if (field == 0 || field > static_cast<uint32_t>(kLastErrc) + 1) return std::nullopt;
  return static_cast<Errc>(field - 1);
}

struct HeartbeatMsg {
  uint64_t client_id = 0;
  uint64_t session = 0;
  uint64_t round = 0;
  // An edge aggregator's clients (absent: no news in this heartbeat). At most kMaxSubtree: a
  // decoder refuses more (kSizeMismatch, or kMalformed where the verifier's table budget, set for
  // kMaxSubtree, runs out first).
  std::optional<std::vector<SubtreePeer>> subtree = std::nullopt;
};
constexpr size_t kMaxSubtree = 10'000;

enum class TaskKind : uint8_t { kFit = 0, kEvaluate = 1 };

struct FitSettings {
  uint32_t epochs = 1;
  uint32_t batch_size = 32;
  float lr = 0.05f;
  float prox_mu = 0.0f;  // FedProx's mu, in [0, 1e4]; 0: plain local SGD
};

struct TaskMsg {
  TaskKind kind = TaskKind::kFit;
  uint64_t round = 0;
  uint32_t phase = 0;
  uint64_t nonce = 0;
  uint64_t run_seed = 0;
  std::string compressor;
  uint64_t model_version = 0;
  uint64_t base_version = 0;  // 0: `model` is whole (dense f32 or f16, QSGD or block levels)
  // One payload per tensor, or against a base version a chain of stc refreshes: k x tensors
  // ternary payloads, refresh by refresh (k <= kMaxRefreshChain). Empty in phases > 0.
  std::vector<compression::Payload> model;
  compression::SharedFactors shared;  // factors empty when the compressor shares none
  FitSettings fit;
  uint32_t deadline_ms = 0;
  std::vector<std::string> metrics;
  // SCAFFOLD: the server's control variate c (numel floats) in a phase-0 Fit task of a SCAFFOLD
  // federation; empty otherwise. decodeTask checks its size and finiteness.
  std::vector<float> control;
  // SCAFFOLD's acknowledgement, with `control`: the last round whose control change from this
  // client (or aggregator) the server counted into c, 0 for none. The client keeps its c_i+ of a
  // round pending until a task acknowledges that round (client/algorithm.h). Set per client with
  // setTaskControlAck. Decoded as nullopt when absent (a server older than the field, which
  // counted every change it got: the client then commits at once, as it did then).
  std::optional<uint64_t> control_ack;
  // Secure aggregation's masked-input step (server/secure_round.h): the client answers with its
  // masked input (client/secure_party.h), made with the shares the server sent just before,
  // never with its update in the clear. A fit task only, of any phase (two-phase PowerSGD masks
  // each phase in an exchange of its own).
  bool secure = false;
};

struct EvaluationMsg {
  uint64_t client_id = 0;
  uint64_t round = 0;
  uint64_t nonce = 0;
  uint64_t num_examples = 0;
  double loss = 0.0;
  double accuracy = 0.0;
};

// kRegistrationRefused: a Register refused for good (the fbs says which); the client gives up.
enum class RejectKind : uint8_t {
  kRefused = 0,
  kNotRegistered = 1,
  kBusy = 2,
  kRegistrationRefused = 3
};

struct RejectMsg {
  RejectKind kind = RejectKind::kRefused;
  uint32_t code = 0;  // Errc
  uint64_t round = 0;
  uint64_t nonce = 0;
  std::string message;  // at most 1024 bytes
};

struct ShutdownMsg {
  uint64_t round = 0;
  std::string reason;
};

struct ChunkMsg {
  uint64_t transfer = 0;
  uint32_t index = 0;
  uint32_t count = 0;
  uint64_t total_bytes = 0;
  std::span<const uint8_t>
      data;  // a view: into the caller's bytes (encode) or the message (decode)
};

std::vector<uint8_t> encode(const RegisterMsg& m);
std::vector<uint8_t> encode(const WelcomeMsg& m);
std::vector<uint8_t> encode(const HeartbeatMsg& m);
std::vector<uint8_t> encode(const EvaluationMsg& m);
std::vector<uint8_t> encode(const RejectMsg& m);
std::vector<uint8_t> encode(const ShutdownMsg& m);
std::vector<uint8_t> encodeChunk(const ChunkMsg& m);
// The task with `model` given as views (the server encodes one buffer per phase and patches the
// nonce per client with setTaskNonce instead of encoding again).
std::vector<uint8_t> encodeTask(const TaskMsg& header,
                                std::span<const compression::PayloadView> model);
// Rewrites the nonce of an encoded task in place (the task must have been encoded with a non-zero
// nonce, so the field is present). Throws InvalidArgument otherwise.
void setTaskNonce(std::span<uint8_t> task_bytes, uint64_t nonce);
// Rewrites the SCAFFOLD acknowledgement of an encoded task in place: a task that carries a control
// variate always holds the field (encodeTask writes it, 0 included). Throws InvalidArgument for a
// task without a control variate.
void setTaskControlAck(std::span<uint8_t> task_bytes, uint64_t round);

// Split fine-tuning (split/net.h, docs/split.md).
struct SplitHelloMsg {
  uint64_t edge_id = 0;
  uint64_t fingerprint = 0;  // the cut model and both codec specs
  std::string up, down;      // codec specs, 1..512 printable bytes each
};

enum class SplitStepKind : uint8_t { kTrain = 0, kTrainTop = 1, kEvaluate = 2 };

struct SplitStepMsg {
  uint64_t session = 0;
  uint64_t step = 0;  // >= 1
  SplitStepKind kind = SplitStepKind::kTrain;
  uint32_t examples = 0;  // >= 1, = labels.size()
  std::vector<uint8_t> labels;
  std::vector<uint8_t> activations;  // non-empty
};

struct SplitReplyMsg {
  uint64_t session = 0;
  uint64_t step = 0;
  double loss = 0;  // finite, >= 0
  uint64_t correct = 0;
  uint64_t cloud_us = 0;
  std::vector<uint8_t> gradient;  // may be empty
};

// SplitFed: an edge's bottom part after an epoch, and the cloud's average of them.
struct SplitBottomMsg {
  uint64_t session = 0;
  uint64_t epoch = 0;         // >= 1
  uint64_t examples = 0;      // >= 1
  std::vector<float> bottom;  // non-empty, finite
};
struct SplitAverageMsg {
  uint64_t session = 0;
  uint64_t epoch = 0;         // >= 1
  uint32_t edges = 0;         // >= 1
  std::vector<float> bottom;  // non-empty, finite
};

// Limits for control messages. `max_bytes` bounds any message; a Task's model is checked against
// `layout` (decodeTask).
struct ControlLimits {
  size_t max_bytes = size_t{1} << 30;
  // The largest mean loss an Evaluation may report (kValueTooLarge above it): a cross-entropy of
  // 1e9 is already no model's; an honest client never comes near, and the server's example-weighted
  // mean of such values stays far from overflow (1.7e308 was once accepted and the weighted
  // sum became inf, then null in the metrics).
  double max_eval_loss = 1e9;
  // The most clients a Heartbeat's subtree may name (kMaxSubtree; 0 where the sender is a client,
  // which has none: kUnexpectedMessage before anything of it is read).
  size_t max_subtree = kMaxSubtree;
};

RegisterMsg decodeRegister(std::span<const uint8_t> bytes, const ControlLimits& limits = {});
WelcomeMsg decodeWelcome(std::span<const uint8_t> bytes, const ControlLimits& limits = {});
HeartbeatMsg decodeHeartbeat(std::span<const uint8_t> bytes, const ControlLimits& limits = {});
EvaluationMsg decodeEvaluation(std::span<const uint8_t> bytes, const ControlLimits& limits = {});
RejectMsg decodeReject(std::span<const uint8_t> bytes, const ControlLimits& limits = {});
ShutdownMsg decodeShutdown(std::span<const uint8_t> bytes, const ControlLimits& limits = {});
// Checks that each model payload is DenseF32, DenseF16 (whole model) or Sparse (against a base
// version) and valid for its tensor (compression::validatePayload: sizes, index order, finite
// values), each shared factor finite and no larger than its tensor (the compressor checks the
// exact shapes before it uses them), and the fit settings within the bounds a server may set
// (epochs <= 1000, batch <= 2^20, 0 < lr <= 100).
TaskMsg decodeTask(std::span<const uint8_t> bytes, const ParamLayout& layout,
                   const ControlLimits& limits = {});
// Split messages (owned copies). decodeSplitStep checks
// step >= 1, a known kind, 1 <= examples = labels' count and activations present (the cloud checks
// the activations' encoding against the cut, split/codec.h); decodeSplitReply checks the loss.
std::vector<uint8_t> encode(const SplitHelloMsg& m);
std::vector<uint8_t> encode(const SplitStepMsg& m);
std::vector<uint8_t> encode(const SplitReplyMsg& m);
SplitHelloMsg decodeSplitHello(std::span<const uint8_t> bytes, const ControlLimits& limits = {});
SplitStepMsg decodeSplitStep(std::span<const uint8_t> bytes, const ControlLimits& limits = {});
SplitReplyMsg decodeSplitReply(std::span<const uint8_t> bytes, const ControlLimits& limits = {});
// Check epoch >= 1, examples (edges) >= 1 and a non-empty, finite bottom (the receiver checks its
// size against the cut and its values against its bound).
std::vector<uint8_t> encode(const SplitBottomMsg& m);
std::vector<uint8_t> encode(const SplitAverageMsg& m);
SplitBottomMsg decodeSplitBottom(std::span<const uint8_t> bytes, const ControlLimits& limits = {});
SplitAverageMsg decodeSplitAverage(std::span<const uint8_t> bytes,
                                   const ControlLimits& limits = {});

// `data` views into `bytes`. Checks index < count, total_bytes > 0, data non-empty and at most
// `max_chunk_bytes`.
ChunkMsg decodeChunk(std::span<const uint8_t> bytes, size_t max_chunk_bytes);

// The most refreshes a task's chain may hold (the stc downlink keeps at most 64).
inline constexpr size_t kMaxRefreshChain = 1024;

// Applies a task's model to `model` (which holds version `held`): whole models (dense f32 or
// f16, QSGD or block levels) overwrite it, deltas patch the coordinates that changed (sparse) or
// add a quantised refresh (QSGD or block levels) or a chain of stc refreshes (ternary), in order
// (server/model_store.h). Throws InvalidArgument if a
// delta's base is not `held` or the sizes do not fit (decodeTask validated the payloads).
void applyModel(const ParamLayout& layout, uint64_t held, uint64_t base_version,
                const std::vector<compression::Payload>& tensors, std::span<float> model);

}  // namespace starling::protocol
