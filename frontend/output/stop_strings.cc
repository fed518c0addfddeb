#include "frontend/output/stop_strings.h"

#include "frontend/output/hold_back.h"

namespace kvserve::frontend {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopStringMatcher::Result StopStringMatcher::Append(std::string_view delta, bool check) {
  Result r;
  if (stopped_) return r;
  pending_.append(delta);
  if (!check) {
    r.emit.swap(pending_);
    return r;
  }
  // The earliest occurrence of any stop string ends the stream.
  size_t first = std::string::npos;
  const std::string* which = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < first) {
      first = at;
      which = &s;
    }
  }
  if (which != nullptr) {
    r.emit = pending_.substr(0, first);
    r.stopped = stopped_ = true;
    r.matched = *which;
    pending_.clear();
    return r;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  const size_t hold = HoldBackLength(pending_, stops_);
  r.emit = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return r;
}

std::string StopStringMatcher::Flush() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  return out;
}

}  // namespace kvserve::frontend
