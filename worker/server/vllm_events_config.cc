#include "worker/server/vllm_events_config.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "nlohmann/json.hpp"

namespace kvserve::worker {
namespace {

using json = nlohmann::json;

absl::Status Bad(std::string_view key, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--kv-events-config: ", Sv(key), " ", Sv(what)));
}

absl::Status CheckEndpoint(std::string_view key, const std::string& endpoint) {
  for (std::string_view scheme : {"tcp://", "ipc://", "inproc://"}) {
    if (endpoint.rfind(scheme, 0) == 0 && endpoint.size() > scheme.size()) {
      return absl::OkStatus();
    }
  }
  return Bad(key, absl::StrCat("'", endpoint, "' must be a tcp://, ipc:// or inproc:// address"));
}

absl::StatusOr<int64_t> Count(std::string_view key, const json& v) {
  if (!v.is_number_integer() || v.get<int64_t>() < 1) return Bad(key, "must be an integer >= 1");
  return v.get<int64_t>();
}

absl::StatusOr<std::string> Text(std::string_view key, const json& v) {
  if (!v.is_string()) return Bad(key, "must be a string");
  return v.get<std::string>();
}

absl::Status Apply(const std::string& key, const json& v, VllmEventsConfig& c) {
  if (key == "enable_kv_cache_events") {
    if (!v.is_boolean()) return Bad(key, "must be true or false");
    c.enable_kv_cache_events = v.get<bool>();
  } else if (key == "publisher") {
    ASSIGN_OR_RETURN(c.publisher, Text(key, v));
    if (c.publisher != "zmq" && c.publisher != "null") {
      return Bad(key, absl::StrCat("'", c.publisher, "' is not served: 'zmq' or 'null'"));
    }
  } else if (key == "endpoint") {
    ASSIGN_OR_RETURN(c.endpoint, Text(key, v));
    RETURN_IF_ERROR(CheckEndpoint(key, c.endpoint));
  } else if (key == "replay_endpoint") {
    if (v.is_null()) {
      c.replay_endpoint.reset();
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(c.replay_endpoint, Text(key, v));
    RETURN_IF_ERROR(CheckEndpoint(key, *c.replay_endpoint));
  } else if (key == "buffer_steps") {
    ASSIGN_OR_RETURN(c.buffer_steps, Count(key, v));
  } else if (key == "hwm") {
    ASSIGN_OR_RETURN(c.hwm, Count(key, v));
  } else if (key == "max_queue_size") {
    ASSIGN_OR_RETURN(c.max_queue_size, Count(key, v));
  } else if (key == "topic") {
    ASSIGN_OR_RETURN(c.topic, Text(key, v));
  } else {
    return Bad(key,
               "is not a key of vLLM's KVEventsConfig that kvserve serves (enable_kv_cache_events, "
               "publisher, endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size, "
               "topic)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<VllmEventsConfig> ParseVllmEventsConfig(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("--kv-events-config: must be a JSON object");
  }
  VllmEventsConfig c;
  for (const auto& [key, value] : j.items()) RETURN_IF_ERROR(Apply(key, value, c));
  return c;
}

}  // namespace kvserve::worker
