#include "server/run_recorder.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"

namespace starling::server {

namespace {
void jsonNumber(std::ostringstream& o, const char* key, double v) {
  o << ",\"" << key << "\":";
  if (std::isfinite(v)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    o << buf;
  } else {
    o << "null";
  }
}
}  // namespace

void MetricsLog::appendLine(const std::string& json) const {
  if (path_.empty()) return;
  std::ofstream out(path_, std::ios::app);
  out << json << '\n';
  if (!out) STARLING_THROW(IoError, "cannot append to the metrics file ", path_);
}

void MetricsLog::complete(uint64_t round, const std::string& json) const {
  if (path_.empty() || json.empty()) return;
  std::string text;
  if (std::filesystem::exists(path_)) {
    const std::vector<uint8_t> bytes = readFile(path_, uint64_t{1} << 32);
    text.assign(bytes.begin(), bytes.end());
  }
  const size_t end = text.rfind('\n');
  const size_t keep = end == std::string::npos ? 0 : end + 1;
  if (keep != text.size()) std::filesystem::resize_file(path_, keep);
  uint64_t last = 0;
  if (keep > 0) {
    const size_t begin = text.rfind('\n', keep - 2);
    const std::string line = text.substr(begin == std::string::npos ? 0 : begin + 1, keep);
    if (const size_t at = line.find("\"round\":"); at != std::string::npos)
      last = std::strtoull(line.c_str() + at + 8, nullptr, 10);
  }
  if (last < round) appendLine(json);
}

std::string RoundRecord::json() const {
  std::ostringstream o;
  o << "{\"round\":" << round << ",\"applied\":" << (applied ? "true" : "false");
  if (!reason.empty()) {
    o << ",\"reason\":\"";
    for (char c : reason)
      o << (c == '"' || c == '\\' ? '\'' : (static_cast<unsigned char>(c) < 0x20 ? ' ' : c));
    o << '"';
  }
  o << ",\"clients_selected\":" << clients_selected
    << ",\"clients_completed\":" << clients_completed << ",\"clients_failed\":" << clients_failed
    << ",\"updates_rejected\":" << updates_rejected << ",\"uplink_bytes\":" << uplink_bytes
    << ",\"downlink_bytes\":" << downlink_bytes << ",\"model_version\":" << model_version;
  if (train_loss) jsonNumber(o, "train_loss", *train_loss);
  for (const auto& [name, value] : metrics)
    jsonNumber(o, name.c_str(), value);  // names checked by validate()
  if (test_accuracy) jsonNumber(o, "test_accuracy", *test_accuracy);
  if (test_loss) jsonNumber(o, "test_loss", *test_loss);
  if (sim_seconds) jsonNumber(o, "sim_seconds", *sim_seconds);
  if (makespan_seconds) jsonNumber(o, "makespan_seconds", *makespan_seconds);
  for (size_t i = 0; i < stage_seconds.size() && i < kStages; ++i)
    jsonNumber(o, kStageKeys[i], stage_seconds[i]);
  if (dp_epsilon) jsonNumber(o, "dp_epsilon", *dp_epsilon);
  if (dp_clip) jsonNumber(o, "dp_clip", *dp_clip);
  if (!secagg_wrong_shares.empty()) {
    o << ",\"secagg_wrong_shares\":[";
    for (size_t i = 0; i < secagg_wrong_shares.size(); ++i)
      o << (i ? "," : "") << secagg_wrong_shares[i];
    o << ']';
  }
  jsonNumber(o, "wall_seconds", wall_seconds);
  o << '}';
  return o.str();
}

RunRecorder::RunRecorder(RecorderConfig config)
    : config_(std::move(config)), log_(config_.metrics), since_(Steady::now()) {}

void RunRecorder::close(RoundRecord& rec, const std::function<void()>& durable,
                        const std::function<void()>& then) {
  const Steady::time_point now = Steady::now();
  rec.wall_seconds = std::chrono::duration<double>(now - since_).count();
  since_ = now;
  if (durable) durable();
  if (config_.lead) log_.append(rec);
  if (then) then();
  if (config_.lead && progress_) progress_(rec);
}

}  // namespace starling::server
